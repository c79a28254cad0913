"""Uploading an exported policy folder to the Hugging Face hub (or any server that speaks its API).

``huggingface_hub`` finds the server and the token the usual way: the server from ``HF_ENDPOINT`` (default
``https://huggingface.co``), the token from ``HF_TOKEN`` or else the one ``hf auth login`` stored.

Example:
    >>> url = upload(Path("my-policy"), "me/pgrank-minilm", private=True)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from pgrank.errors import PgrankError

COMMIT_MESSAGE = "Upload a policy exported by pgrank export"


def _transport_errors() -> tuple[type[Exception], ...]:
    """The errors of the HTTP client under ``huggingface_hub`` (a refused connection, a timeout): it has used
    ``requests``, ``httpx`` and ``httpx2`` in turn."""
    found: list[type[Exception]] = []
    with contextlib.suppress(ImportError):
        from httpx2 import HTTPError as Httpx2Error

        found.append(Httpx2Error)
    with contextlib.suppress(ImportError):
        from httpx import HTTPError as HttpxError

        found.append(HttpxError)
    with contextlib.suppress(ImportError):
        from requests import RequestException

        found.append(RequestException)
    return tuple(found)


def check_upload(repo_id: str) -> None:
    """Refuse an upload that cannot happen before anything is exported: ``HF_HUB_OFFLINE`` set, or a ``repo_id``
    the hub would refuse.

    Raises:
        PgrankError: naming what is wrong.
    """
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise PgrankError(f"--hub {repo_id}: not a repository id (namespace/name): {' '.join(str(exc).split())}") from None
    if constants.is_offline_mode():
        raise PgrankError(f"--hub {repo_id}: HF_HUB_OFFLINE is set; unset it to upload to {constants.ENDPOINT}")


def upload(folder: Path, repo_id: str, *, private: bool = False) -> str:
    """Create the model repository ``repo_id`` if it does not exist, and upload ``folder`` to it in one commit.

    Args:
        folder: an exported policy (:func:`pgrank.export.folder.export_policy`).
        repo_id: ``namespace/name`` on the hub.
        private: create the repository private (an existing one keeps its visibility).

    Returns:
        The URL of the commit.

    Raises:
        PgrankError: the hub refused the repository or the upload, could not be reached, or ``HF_HUB_OFFLINE``
            is set; one line naming the repository and the endpoint.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        api.create_repo(repo_id, repo_type="model", private=private or None, exist_ok=True)
        commit = api.upload_folder(repo_id=repo_id, repo_type="model", folder_path=str(folder),
                                   commit_message=COMMIT_MESSAGE)
    except OfflineModeIsEnabled:
        raise PgrankError(f"--hub {repo_id}: HF_HUB_OFFLINE is set; unset it to upload to {api.endpoint}") from None
    except (HfHubHTTPError, *_transport_errors(), OSError, ValueError) as exc:
        reason = " ".join(str(exc).split())  # one line: the CLI prints it as a one-line error
        raise PgrankError(f"--hub {repo_id}: upload to {api.endpoint} failed: {reason}") from None
    return str(commit.commit_url)
