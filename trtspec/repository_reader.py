"""Reading a Triton model repository: each model directory's config.pbtxt, parsed with Triton's ModelConfig.

Below both the repository writer (trtspec.repository) and the server (trtspec.server), which read what it wrote.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TRTLLM_BACKEND = "tensorrtllm"


class RepositoryError(Exception):
    """A repository that cannot be written or read; the message says why."""


@dataclass(frozen=True)
class RepositoryModel:
    """One model directory of a Triton model repository."""

    name: str
    path: Path
    backend: str = ""
    platform: str = ""
    #: the parsed ``tritonclient.grpc.model_config_pb2.ModelConfig`` (None if config.pbtxt did not parse)
    config: Any = None
    #: why config.pbtxt did not parse (e.g. unfilled ``${...}`` template fields); backend/platform then come from a
    #: line scan
    parse_error: str | None = None

    @property
    def is_trtllm(self) -> bool:
        return self.backend == TRTLLM_BACKEND

    def parameter(self, key: str) -> str | None:
        if self.config is None or key not in self.config.parameters:
            return None
        return self.config.parameters[key].string_value


_FIELD_RE = {k: re.compile(rf'^\s*{k}\s*:\s*"([^"]*)"', re.M) for k in ("name", "backend", "platform")}


def read_model_config(config_path: Path) -> RepositoryModel:
    """Parse one ``config.pbtxt`` with ``ModelConfig`` via ``google.protobuf.text_format``."""
    text = config_path.read_text()
    model_dir = config_path.parent
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2

        cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
        return RepositoryModel(
            name=cfg.name or model_dir.name, path=model_dir, backend=cfg.backend, platform=cfg.platform, config=cfg
        )
    except Exception as e:  # text_format.ParseError, or tritonclient[grpc] missing
        found = {k: (m.group(1) if (m := r.search(text)) else "") for k, r in _FIELD_RE.items()}
        return RepositoryModel(
            name=found["name"] or model_dir.name, path=model_dir, backend=found["backend"],
            platform=found["platform"], parse_error=str(e).splitlines()[0] if str(e) else type(e).__name__,
        )


def read_repository(model_repository: str | Path) -> list[RepositoryModel]:
    """Every model (sub-directory with a ``config.pbtxt``) of a repository, sorted by directory name."""
    repo = Path(model_repository).expanduser()
    if not repo.is_dir():
        raise RepositoryError(f"model repository {repo} does not exist or is not a directory")
    return [read_model_config(d / "config.pbtxt") for d in sorted(repo.iterdir()) if (d / "config.pbtxt").is_file()]
