"""What specgate never writes: the value of a variable whose name says it holds a secret (an API
key, a hub token), in report.json, baselines.json, summary.md, report.html, a kept server's record
or specgate's lines in a server log. :func:`is_secret_name` decides what is a secret; the rest
applies it to what is written and to what an older specgate wrote (:func:`redact`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# A name holding one of these words, in any case, holds a secret (VLLM_API_KEY, HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, PGPASSWORD, GOOGLE_APPLICATION_CREDENTIALS).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
REDACTED = "<redacted>"
# A command-line option that takes a secret: its last word is one (--api-key, --hf-token). The
# whole-name rule would also catch --max-num-batched-tokens and --tokenizer, which hold none.
_SECRET_OPTION = re.compile(
    r"^--?(?:[\w-]*[-_])?(?:key|token|secret|password|credentials?)(?:=|$)", re.I)
# A key of a JSON object shaped like an environment variable's name (HF_TOKEN), not like one of a
# report's own fields (decode_tokens_per_s, sample_keys)
_VARIABLE_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def is_secret_name(name: str) -> bool:
    """Whether a variable named ``name`` may hold a secret: its name holds KEY, TOKEN, SECRET,
    PASSWORD or CREDENTIAL, in any case. Such a value is never written, whatever else says to."""
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less every variable :func:`is_secret_name` names."""
    return {name: value for name, value in env.items() if not is_secret_name(name)}


def redacted_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every secret option's value (``--api-key K``, ``--hf-token=K``) replaced."""
    out: list[str] = []
    takes_value = False
    for arg in argv:
        if takes_value and not arg.startswith("--"):
            out.append(REDACTED)
        elif _SECRET_OPTION.match(arg) and "=" in arg:
            out.append(f"{arg.split('=', 1)[0]}={REDACTED}")
        else:
            out.append(arg)
        takes_value = bool(_SECRET_OPTION.match(arg)) and "=" not in arg
    return out


def redact(data: Any, where: str = "") -> list[str]:
    """Take out of JSON data (a report or baselines file as loaded, changed in place) every secret
    an older specgate wrote: secret ``env`` entries, other keys shaped like a secret variable's
    name, secret options' values in ``server_args`` or ``argv``. Returns where each was."""
    found: list[str] = []
    if isinstance(data, dict):
        for key in list(data):
            path = f"{where}.{key}" if where else str(key)
            value = data[key]
            if key == "env" and isinstance(value, dict):
                for name in [n for n in value if is_secret_name(str(n))]:
                    del value[name]
                    found.append(f"{path}.{name}")
            elif _VARIABLE_NAME.match(str(key)) and is_secret_name(str(key)):
                del data[key]
                found.append(path)
                continue
            elif key in ("server_args", "argv") and isinstance(value, list) \
                    and all(isinstance(a, str) for a in value):
                clean = redacted_argv(value)
                if clean != value:
                    data[key] = clean
                    found.append(path)
                continue
            found += redact(value, path)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            found += redact(item, f"{where}[{i}]")
    return found
