"""Reading an LLM's reply: why it stopped, its code block and its stated intent."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ._base import Usage


class Stop(enum.Enum):
    """Why the model stopped writing."""

    COMPLETE = "complete"
    TRUNCATED = "truncated"   # hit max tokens or the context window
    REFUSED = "refused"


@dataclass(frozen=True)
class Reply:
    """One provider response, reduced to what kforge keeps."""

    text: str
    stop: Stop
    usage: Usage              # tokens and model as the server reported them; dollars are added later


@dataclass(frozen=True)
class CodeBlock:
    lang: str
    code: str
    closed: bool


_C_LANGS = {"", "cuda", "cu", "c", "cpp", "c++", "cc", "cxx", "h", "hpp"}
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+#.-]*)")
_INTENT = re.compile(r"^[\s>*_#`-]*intent[*_`]*\s*:[*_`\s]*(.+?)[*_`\s]*$", re.IGNORECASE | re.MULTILINE)


def code_blocks(text: str) -> list[CodeBlock]:
    """Every fenced block in ``text``; a last block left open is returned with closed=False."""
    blocks: list[CodeBlock] = []
    fence, lang, body = "", "", []
    for line in text.splitlines():
        match = _FENCE.match(line)
        if not fence:
            if match:
                fence, lang, body = match.group(1), match.group(2).lower(), []
        elif match and line.strip() == match.group(1) and match.group(1).startswith(fence):
            blocks.append(CodeBlock(lang, "\n".join(body) + "\n", True))
            fence = ""
        else:
            body.append(line)
    if fence:
        blocks.append(CodeBlock(lang, "\n".join(body) + "\n", False))
    return blocks


def extract_code(text: str, *, truncated: bool) -> str | None:
    """The kernel source in a reply: the last block that defines kf_launch, else the longest C/CUDA
    block. A block cut off by the token limit is never taken; one merely left open otherwise is."""
    blocks = [b for b in code_blocks(text) if b.closed or not truncated]
    with_entry = [b for b in blocks if "kf_launch" in b.code]
    if with_entry:
        return with_entry[-1].code
    c_like = [b for b in blocks if b.lang in _C_LANGS and b.code.strip()]
    return max(c_like, key=lambda b: len(b.code)).code if c_like else None


def extract_intent(text: str) -> str:
    match = _INTENT.search(text)
    return match.group(1).strip()[:300] if match else "no intent given"
