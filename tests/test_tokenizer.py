import json
import random
import shutil
import unicodedata
from pathlib import Path

import pytest

from models.common.tokenizer import (
    FIRST_SPECIAL_ID,
    PRETOKENIZE_REGEX,
    SPECIAL_TOKENS,
    Tokenizer,
    merges_from_ranks,
    parse_tiktoken,
    qwen_tiktoken_path,
)
from tests.reference_paths import save_tokenizer

FIXED_TEXTS = [
    "Hello world",
    "You are a helpful assistant.",
    "你好，世界！今天天气怎么样？",
    "Emoji: 🎉🙂👩‍👩‍👧 and flags 🇨🇳🇺🇸",
    "It's, we'll, THEY'RE, I'M, she'd, you've",
    "numbers 1234567890 3.14159 -42 1e-9",
    "  leading spaces\n\n\ttabs\r\nwindows line\n   \n",
    "def f(x):\n    return x**2  # comment\n",
    "Ünïcödé ñ café naïve Ελληνικά русский العربية हिन्दी 日本語のテキスト 한국어",
    "e\u0301 combining accent (NFC makes it é)",
    "<not a special> <|not_special|> <|im_start",
    "a" * 300 + " " * 50 + "!" * 40,
]

ALPHABET = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(" \t\n\r.,;:!?'\"()[]{}<>|/\\-_=+*&^%$#@~`")
    + list("你好世界中文字符测试的一是了我不人在他有这个上们来到时大地为子中你说生国年着就那和要")
    + list("éèàüöñçßøåœæ") + ["e\u0301", "\u200d", "\u00a0", "\u3000"]
    + list("абвгдеёжзийклмнопрстуфхцчшщъыьэюя") + list("αβγδεζηθ") + list("あいうえおカタカナ한국어")
    + ["🎉", "🙂", "👍🏽", "🇯🇵", "😀", "𝔘"]
)  # fmt: skip


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 60))) for _ in range(n)]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.builtin()


@pytest.fixture(scope="module")
def saved_dir(tok: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen_tokenizer")
    save_tokenizer(tok, path)
    return path


def test_special_token_ids(tok: Tokenizer) -> None:
    assert [tok.special_ids[t] for t in SPECIAL_TOKENS] == list(range(151643, 151676))
    named = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|audio_start|>": 151669,
        "<|audio_end|>": 151670,
        "<tts_pad>": 151671,
        "<tts_text_bos>": 151672,
        "<tts_text_eod>": 151673,
        "<|audio_pad|>": 151675,
    }
    assert {t: tok.special_ids[t] for t in named} == named
    assert tok.vocab_size == FIRST_SPECIAL_ID + len(SPECIAL_TOKENS) == 151676


def test_known_ids(tok: Tokenizer) -> None:
    assert tok.encode("system") == [8948]
    assert tok.encode("user") == [872]
    assert tok.encode("assistant") == [77091]
    assert tok.encode("\n") == [198]
    assert tok.encode("You are a helpful assistant.") == [2610, 525, 264, 10950, 17847, 13]
    assert tok.encode("<|im_start|>user\nHello<|im_end|>") == [151644, 872, 198, 9707, 151645]


def test_matches_tiktoken_reference(tok: Tokenizer) -> None:
    tiktoken = pytest.importorskip("tiktoken")
    ranks = parse_tiktoken(qwen_tiktoken_path().read_bytes())
    reference = tiktoken.Encoding("qwen", pat_str=PRETOKENIZE_REGEX, mergeable_ranks=ranks, special_tokens={})
    for text in FIXED_TEXTS + random_texts(400):
        assert tok.encode(text) == reference.encode_ordinary(unicodedata.normalize("NFC", text)), repr(text)


def test_merges_from_ranks_small_table() -> None:
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5, b"cc": 6, b"ccc": 7}
    assert merges_from_ranks(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc"), (b"c", b"c"), (b"cc", b"c")]
    with pytest.raises(ValueError, match="not reachable"):
        merges_from_ranks({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_round_trip(tok: Tokenizer) -> None:
    for text in FIXED_TEXTS + random_texts(100, seed=1):
        nfc = unicodedata.normalize("NFC", text)
        assert tok.decode(tok.encode(text)) == nfc
        assert tok.decode_bytes(tok.encode(text)) == nfc.encode("utf-8")


def test_special_tokens_in_text_and_skipping(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>assistant\n<think>x</think>hi 👋<|im_end|><|audio_pad|>")
    assert ids[:3] == [151644, 77091, 198]
    assert ids[-2:] == [151645, 151675]
    assert tok.decode(ids) == "<|im_start|>assistant\n<think>x</think>hi 👋<|im_end|><|audio_pad|>"
    assert tok.decode(ids, skip_special=True) == "assistant\n<think>x</think>hi 👋"
    assert tok.decode([tok.vocab_size, -1, 10**9]) == "\ufffd" * 3  # model output never fails to decode


def test_stream_decoder_holds_back_partial_characters(tok: Tokenizer) -> None:
    text = "Streaming 流式转写 🫠𓀀 🎉🙂 👩‍👩‍👧 ok, naïve café 🇯🇵 㐀ꙮ!"
    ids = tok.encode(text) + [tok.special_ids["<|im_end|>"]]
    for skip in (False, True):
        stream = tok.stream_decoder(skip_special=skip)
        pieces = [stream.push(i) for i in ids]
        assert stream.flush() == ""
        assert "".join(pieces) == text + ("" if skip else "<|im_end|>")
        assert "\ufffd" not in "".join(pieces)
        assert any(p == "" for p in pieces[:-1])


def test_stream_decoder_flushes_dangling_bytes(tok: Tokenizer) -> None:
    emoji_ids = tok.encode("🫠")
    assert len(emoji_ids) == 3
    stream = tok.stream_decoder()
    assert [stream.push(i) for i in emoji_ids[:-1]] == [""] * (len(emoji_ids) - 1)
    assert stream.flush() == "\ufffd"
    assert stream.push(tok.encode("ok")[0]) == "ok"


def test_from_dir_tokenizer_json(tok: Tokenizer, saved_dir: Path, tmp_path: Path) -> None:
    shutil.copy(saved_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    loaded = Tokenizer.from_dir(tmp_path)
    assert loaded.special_ids == tok.special_ids and loaded.vocab_size == tok.vocab_size
    for text in FIXED_TEXTS + random_texts(50, seed=2):
        assert loaded.encode(text) == tok.encode(text)


def test_from_dir_vocab_and_merges(tok: Tokenizer, saved_dir: Path, tmp_path: Path) -> None:
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(saved_dir / name, tmp_path / name)
    loaded = Tokenizer.from_dir(tmp_path)
    assert loaded.special_ids == tok.special_ids and loaded.vocab_size == tok.vocab_size
    for text in FIXED_TEXTS + random_texts(50, seed=3) + ["<|im_start|>user\n<|audio_pad|><|audio_pad|>hi<|im_end|>"]:
        assert loaded.encode(text) == tok.encode(text)
    ids = tok.encode("<|im_end|><think>")
    assert loaded.decode(ids, skip_special=True) == tok.decode(ids, skip_special=True) == "<think>"


def test_load(saved_dir: Path, tmp_path: Path) -> None:
    assert Tokenizer.builtin().encode("assistant") == [77091]
    assert Tokenizer.load(tmp_path).special_ids["<|audio_pad|>"] == 151675
    assert Tokenizer.load(saved_dir).encode("user") == [872]
    with pytest.raises(ValueError, match="checkpoint directory"):
        Tokenizer.load(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        Tokenizer.from_dir(tmp_path)


def test_builtin_builds_then_reuses_cache(tok: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_REALTIME_CACHE", str(tmp_path / "cache"))
    built = Tokenizer.builtin()
    (cached,) = (tmp_path / "cache").glob("qwen-bpe-*.json")
    assert json.loads(cached.read_text(encoding="utf-8"))["normalizer"]["type"] == "NFC"
    reloaded = Tokenizer.builtin()
    for text in FIXED_TEXTS:
        assert built.encode(text) == reloaded.encode(text) == tok.encode(text)


def test_transformers_qwen2_tokenizer_agrees(tok: Tokenizer, saved_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    vocab = json.loads((saved_dir / "vocab.json").read_text(encoding="utf-8"))
    lines = (saved_dir / "merges.txt").read_text(encoding="utf-8").splitlines()[1:]
    reference = transformers.Qwen2Tokenizer(vocab=vocab, merges=[tuple(line.split(" ")) for line in lines])
    for text in FIXED_TEXTS:
        assert reference.encode(text, add_special_tokens=False) == tok.encode(text), repr(text)
    auto = transformers.AutoTokenizer.from_pretrained(saved_dir)
    text = "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>你好<|im_end|>\n<|im_start|>assistant\n"
    assert auto.encode(text, add_special_tokens=False) == tok.encode(text)
    assert auto.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(151643, 151676))
