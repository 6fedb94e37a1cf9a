"""Checkpoint I/O: Hugging Face folders and GGUF files in, Hugging Face folders out.

* :mod:`specjax.io.hf`: Hugging Face folders (:func:`load_pretrained`, which also
  sends a ``.gguf`` path to :mod:`specjax.io.gguf`, and :func:`save_pretrained`);
* :mod:`specjax.io.hf_config`: ``config.json`` <-> ``ModelConfig``;
* :mod:`specjax.io.tensors`: Hugging Face tensor names <-> model parameters,
  shared by both formats;
* :mod:`specjax.io.gguf` and :mod:`specjax.io.gguf_tokenizer`: llama.cpp GGUF files
  and the tokenizer rebuilt from their metadata, imported only when a GGUF file
  is loaded (the reader needs the optional ``gguf`` package);
* :mod:`specjax.io.converted`: a GGUF file's converted weights, kept once as a
  Hugging Face folder (or, for a quantized load, its int8 model), so the next load
  takes seconds;
* :mod:`specjax.io.drafter_weights`: drafters saved to and loaded from folders (a
  block drafter's or EAGLE head's own weights, a draft model's folder);
* :mod:`specjax.io.atomic`: folder writes a reader sees whole or not at all;
* :mod:`specjax.io.fetch`: models by name (`specjax.fetch`), fetched once into the cache.
"""

from specjax.io.hf import load_pretrained as load_pretrained
from specjax.io.hf import save_pretrained as save_pretrained
from specjax.io.hf_config import config_from_hf as config_from_hf
from specjax.io.hf_config import config_to_hf as config_to_hf
