"""Llama-family decoder models and their KV cache (checkpoint I/O is :mod:`specjax.io`)."""

from specjax.models.cache import KVCache as KVCache
from specjax.models.config import SUPPORTED_MODEL_TYPES as SUPPORTED_MODEL_TYPES
from specjax.models.config import ModelConfig as ModelConfig
from specjax.models.llama import Transformer as Transformer
from specjax.models.model import Model as Model
