"""specjax: on-device, batched, exact speculative decoding in JAX/Flax.

The top level holds what a user needs: text in and text out (`Sampler`,
`ChatSampler`), the functional decoders for a jitted loop of one's own (`generate`,
`speculative_generate`), their settings and results, the drafters, the model
contract, and loading and saving. Everything else lives in a submodule:

* `specjax.decoding`: the open loop (``init``, ``step``, ``result``, ``stream``), the
  loop state and statistics, per-row features;
* `specjax.drafters`: the drafter contract, the built-in drafters and the registry;
* `specjax.models`: the reference model, caches, quantisation and sharding;
* `specjax.sampling`: logits to probabilities, sampling, penalties, constraints, stop
  strings;
* `specjax.verification`: rejection sampling, coupled and tree verification;
* `specjax.io`: checkpoints, the Hub, tokenizers, chat templates, the shipped pairs;
* `specjax.training`: training drafters;
* `specjax.tuning`: choosing γ for this machine from measured step costs;
* `specjax.testing`: tiny models and the statistical tests the suite uses.

``import specjax`` changes no jax setting; `enable_compilation_cache` turns jax's
persistent compilation cache on, as the ``specjax`` command does.
"""

from specjax import decoding as decoding
from specjax import drafters as drafters
from specjax import io as io
from specjax import models as models
from specjax import sampling as sampling
from specjax import testing as testing
from specjax import training as training
from specjax import tuning as tuning
from specjax import verification as verification
from specjax.core.compilation_cache import enable as enable_compilation_cache
from specjax.decoding import GenerationResult as GenerationResult
from specjax.decoding import generate as generate
from specjax.decoding import speculative_generate as speculative_generate
from specjax.decoding.model_check import ModelContractError as ModelContractError
from specjax.decoding.model_check import check_model as check_model
from specjax.drafters import BlockDrafter as BlockDrafter
from specjax.drafters import Drafter as Drafter
from specjax.drafters import DraftModel as DraftModel
from specjax.drafters import EagleDrafter as EagleDrafter
from specjax.drafters import PromptLookup as PromptLookup
from specjax.drafters import Proposal as Proposal
from specjax.io import load_pretrained as load_pretrained
from specjax.io import save_pretrained as save_pretrained
from specjax.io.chat import apply_chat_template as apply_chat_template
from specjax.io.fetch import fetch as fetch
from specjax.io.pretrained import default_pair as default_pair
from specjax.models import KVCache as KVCache
from specjax.models import Model as Model
from specjax.models import ModelConfig as ModelConfig
from specjax.models.contract import ModelOutput as ModelOutput
from specjax.sampling import SamplingConfig as SamplingConfig
from specjax.sampling.constraints import Constraint as Constraint
from specjax.sampling.stops import StopStrings as StopStrings
from specjax.text import ChatSampler as ChatSampler
from specjax.text import GenerationOptions as GenerationOptions
from specjax.text import Sampler as Sampler

__version__ = "0.6.0"

__all__ = [
    "Sampler",
    "ChatSampler",
    "GenerationOptions",
    "generate",
    "speculative_generate",
    "GenerationResult",
    "SamplingConfig",
    "Constraint",
    "StopStrings",
    "Drafter",
    "Proposal",
    "DraftModel",
    "PromptLookup",
    "BlockDrafter",
    "EagleDrafter",
    "Model",
    "ModelConfig",
    "ModelOutput",
    "KVCache",
    "check_model",
    "ModelContractError",
    "load_pretrained",
    "save_pretrained",
    "fetch",
    "default_pair",
    "apply_chat_template",
    "enable_compilation_cache",
]
