"""Llama-family decoder models, their KV cache, and Hugging Face import/export."""

from specjax.models.cache import KVCache as KVCache
from specjax.models.config import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from specjax.models.config import ModelConfig as ModelConfig
from specjax.models.hf import config_from_hf as config_from_hf
from specjax.models.hf import config_to_hf as config_to_hf
from specjax.models.hf import load_pretrained as load_pretrained
from specjax.models.hf import save_pretrained as save_pretrained
from specjax.models.llama import Model as Model
from specjax.models.llama import Transformer as Transformer
