"""specjax: on-device, batched, exact speculative decoding in JAX/Flax."""

from specjax import decoding as decoding
from specjax import drafters as drafters
from specjax import testing as testing
from specjax.core import compilation_cache as compilation_cache
from specjax.decoding import DecodeState as DecodeState
from specjax.decoding import GenerationResult as GenerationResult
from specjax.decoding import GenerationStats as GenerationStats
from specjax.decoding import generate as generate
from specjax.decoding import speculative_generate as speculative_generate
from specjax.decoding.model_check import ModelContractError as ModelContractError
from specjax.decoding.model_check import check_model as check_model
from specjax.drafters import BlockDrafter as BlockDrafter
from specjax.drafters import Drafter as Drafter
from specjax.drafters import DraftModel as DraftModel
from specjax.drafters import EagleDrafter as EagleDrafter
from specjax.drafters import NoDraft as NoDraft
from specjax.drafters import PromptLookup as PromptLookup
from specjax.drafters import Proposal as Proposal
from specjax.io import load_pretrained as load_pretrained
from specjax.io import save_pretrained as save_pretrained
from specjax.io.chat import apply_chat_template as apply_chat_template
from specjax.io.fetch import fetch as fetch
from specjax.io.pretrained import default_drafter as default_drafter
from specjax.io.pretrained import default_pair as default_pair
from specjax.io.pretrained import smollm2_drafter as smollm2_drafter
from specjax.models import KVCache as KVCache
from specjax.models import Model as Model
from specjax.models import ModelConfig as ModelConfig
from specjax.models import sharding as sharding
from specjax.models.contract import ModelOutput as ModelOutput
from specjax.sampling import SamplingConfig as SamplingConfig
from specjax.sampling import probs_from_logits as probs_from_logits
from specjax.sampling import sample as sample
from specjax.sampling.constraints import Constraint as Constraint
from specjax.sampling.stops import StopStrings as StopStrings
from specjax.verification import coupled_verify as coupled_verify
from specjax.verification import greedy_verify as greedy_verify
from specjax.verification import rejection_sample as rejection_sample
from specjax.verification import rejection_sample_onehot as rejection_sample_onehot

__version__ = "0.1.0"
