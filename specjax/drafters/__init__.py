"""Drafters: who proposes the γ tokens the target verifies.

* `specjax.drafters.base`: the contract every drafter follows (`Drafter`, `Proposal`;
  the target's hidden states a drafter may read are a
  `specjax.models.forward.TargetHidden`);
* `specjax.drafters.draft_model`: `DraftModel`, a smaller LM;
* `specjax.drafters.lookup`: `PromptLookup` (no weights); `NoDraft` (γ = 0) is in `base`;
* `specjax.drafters.suffix`: `SuffixDrafter`, the longest suffix match in the row's text
  and a corpus (no weights);
* `specjax.drafters.chain`: `ChainDrafter`, a suffix drafter where it has a match and a
  draft model elsewhere;
* `specjax.drafters.features`: `FeatureDrafter`, the shared base of the drafters that
  read the target's hidden states, `specjax.drafters.block` (`BlockDrafter`) and
  `specjax.drafters.eagle` (`EagleDrafter`);
* `specjax.drafters.checks`: whether a drafter can serve a target (`check_drafter`),
  run by the decoders before anything compiles;
* `specjax.drafters.registry`: the drafters by name (``--drafter``,
  `specjax.io.pretrained.default_drafter`).

Drafters are inference only: `specjax.io.drafter_weights` saves and loads them and
`specjax.training` trains them.
"""

from specjax.drafters.base import Drafter as Drafter
from specjax.drafters.base import NoDraft as NoDraft
from specjax.drafters.base import Proposal as Proposal
from specjax.drafters.base import TreeDrafter as TreeDrafter
from specjax.drafters.base import as_tree as as_tree
from specjax.drafters.base import lookahead as lookahead
from specjax.drafters.block import BlockDrafter as BlockDrafter
from specjax.drafters.chain import ChainDrafter as ChainDrafter
from specjax.drafters.draft_model import DraftModel as DraftModel
from specjax.drafters.eagle import EagleDrafter as EagleDrafter
from specjax.drafters.features import FeatureDrafter as FeatureDrafter
from specjax.drafters.lookup import PromptLookup as PromptLookup
from specjax.drafters.suffix import SuffixDrafter as SuffixDrafter
