"""The decoder's per-row features, each one file behind one protocol (`RowFeature`).

The decoder always runs `Statistics`, `DraftFlags`, `Logprobs` and `TopLogprobs`;
`Penalize`, `StopAtStrings` and `Constrain` join when a call asks for them, and a
user's own features join with ``features=`` (`specjax.speculative_generate`). A new
built-in feature is one file here and one line in `specjax.decoding.build`.
"""

from specjax.decoding.features.base import BufferFeature as BufferFeature
from specjax.decoding.features.base import Emission as Emission
from specjax.decoding.features.base import RowFeature as RowFeature
from specjax.decoding.features.base import gather_slots as gather_slots
from specjax.decoding.features.base import write_slots as write_slots
from specjax.decoding.features.constraint import Constrain as Constrain
from specjax.decoding.features.draft_flags import DraftFlags as DraftFlags
from specjax.decoding.features.logprobs import Logprobs as Logprobs
from specjax.decoding.features.penalties import Penalize as Penalize
from specjax.decoding.features.statistics import Statistics as Statistics
from specjax.decoding.features.stop_strings import StopAtStrings as StopAtStrings
from specjax.decoding.features.top_logprobs import TopLogprobs as TopLogprobs

__all__ = [
    "BufferFeature",
    "Constrain",
    "DraftFlags",
    "Emission",
    "Logprobs",
    "Penalize",
    "RowFeature",
    "Statistics",
    "StopAtStrings",
    "TopLogprobs",
    "gather_slots",
    "write_slots",
]
