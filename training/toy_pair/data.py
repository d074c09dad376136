"""Reproducible offline corpus, BPE tokenizer and token batches for the bundled models.

Default corpus: the CPython standard library `.py` sources (code) plus the English reference text
in `pydoc_data/topics.py` (prose, one document per topic, train copies upsampled). Any other
directory works too: `.py` files are code, `.txt`/`.md`/`.rst` files are prose. Documents are split
train/validation by a hash of their name, so the split never depends on which other files exist.
"""
import ast
import hashlib
import os
import platform
import sysconfig
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOT = "<|endoftext|>"  # the only special token: bos, eos, pad and unk; also the document separator
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "encodings", "turtledemo", "ensurepip", "pydoc_data",
                           "site-packages", "dist-packages", "__pycache__"})
PROSE_SUFFIXES = (".txt", ".md", ".rst")
TOPICS_PATH = "pydoc_data/topics.py"


@dataclass(frozen=True)
class Document:
    """One corpus document; `name` is its path relative to the corpus root (topics: path::key)."""

    name: str
    kind: str  # "code" or "prose"
    split: str  # "train" or "val"
    text: str


@dataclass(frozen=True)
class Corpus:
    """Documents sorted by name, plus the manifest that goes into the model card."""

    documents: tuple[Document, ...]
    manifest: dict

    def select(self, split: str, kind: str | None = None) -> list[Document]:
        return [d for d in self.documents if d.split == split and (kind is None or d.kind == kind)]


@dataclass(frozen=True)
class HeldoutPrompt:
    """A held-out evaluation prompt: token ids from the start of a validation-document chunk."""

    kind: str  # "code" or "prose"
    source: str  # document name and token offset
    ids: tuple[int, ...]
    following: tuple[int, ...] = ()  # the document's true next tokens after the prompt (the reference continuation)


def stable_hash(name: str) -> int:
    """Platform-independent hash of a document name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big")


def split_of(name: str, val_permille: int) -> str:
    return "val" if stable_hash(name) % 1000 < val_permille else "train"


def _walk_files(root: str, suffixes: tuple[str, ...], max_bytes: int) -> list[str]:
    """Relative paths under root with a wanted suffix, skipping excluded dirs and oversized files."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS and not d.startswith("config-"))
        for f in filenames:
            path = os.path.join(dirpath, f)
            # _sysconfigdata_* holds this machine's build paths: not code, and not reproducible
            if f.endswith(suffixes) and not f.startswith("_sysconfigdata") and os.path.getsize(path) <= max_bytes:
                found.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return sorted(found)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _pydoc_topics(stdlib: str) -> dict[str, str]:
    """The `topics` dict of pydoc_data/topics.py, read without importing it."""
    tree = ast.parse(_read(os.path.join(stdlib, TOPICS_PATH)))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"no topics dict in {TOPICS_PATH}")


def _ensure_val(docs: list[Document]) -> list[Document]:
    """Make sure every kind with ≥ 2 documents has one in validation (tiny corpora), deterministically."""
    docs = list(docs)
    for kind in sorted({d.kind for d in docs}):
        mine = [i for i, d in enumerate(docs) if d.kind == kind]
        if len(mine) >= 2 and all(docs[i].split == "train" for i in mine):
            i = min(mine, key=lambda i: stable_hash(docs[i].name))
            docs[i] = Document(docs[i].name, kind, "val", docs[i].text)
    return docs


def load_corpus(corpus_dir: str | None = None, val_permille: int = 30, prose_val_permille: int = 100,
                max_file_bytes: int = 400_000, prose_upsample: int = 3) -> Corpus:
    """Collect documents (default: CPython stdlib + pydoc topics), split them and build the manifest.

    Prose gets a larger validation share (10%) because it is only ~5% of the bytes: at 3% the
    stdlib corpus would hold out about 3 topics, too few tokens for a stable prose loss.
    """
    root = corpus_dir or sysconfig.get_paths()["stdlib"]
    suffixes = (".py",) if corpus_dir is None else (".py",) + PROSE_SUFFIXES
    docs = []
    for p in _walk_files(root, suffixes, max_file_bytes):
        kind = "code" if p.endswith(".py") else "prose"
        permille = val_permille if kind == "code" else prose_val_permille
        docs.append(Document(p, kind, split_of(p, permille), _read(f"{root}/{p}")))
    if corpus_dir is None:
        docs += [Document(f"{TOPICS_PATH}::{k}", "prose", split_of(f"{TOPICS_PATH}::{k}", prose_val_permille), v)
                 for k, v in _pydoc_topics(root).items()]
    docs = _ensure_val(sorted(docs, key=lambda d: d.name))
    digest = hashlib.sha256()
    for d in docs:
        digest.update(d.name.encode() + b"\0" + d.text.encode() + b"\0")
    counts = {s: {k: sum(1 for d in docs if d.split == s and d.kind == k) for k in ("code", "prose")}
              for s in ("train", "val")}
    nbytes = {s: {k: sum(len(d.text.encode()) for d in docs if d.split == s and d.kind == k)
                  for k in ("code", "prose")} for s in ("train", "val")}
    manifest = {
        "source": "cpython-stdlib+pydoc-topics" if corpus_dir is None else f"directory:{os.path.basename(root)}",
        "python_version": platform.python_version(),
        "excluded_dirs": sorted(EXCLUDED_DIRS), "max_file_bytes": max_file_bytes,
        "val_permille": {"code": val_permille, "prose": prose_val_permille}, "prose_train_upsample": prose_upsample,
        "documents": counts, "bytes": nbytes, "sha256": digest.hexdigest(),
    }
    return Corpus(tuple(docs), manifest)


def train_tokenizer(corpus: Corpus, vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the training documents; EOT is the only special token."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([d.text for d in corpus.select("train")], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT,
                                   unk_token=EOT, clean_up_tokenization_spaces=False)


def encode_documents(tokenizer: PreTrainedTokenizerFast, docs: list[Document]) -> list[list[int]]:
    return tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]


def token_stream(tokenizer: PreTrainedTokenizerFast, docs: list[Document], upsample_prose: int = 1) -> torch.Tensor:
    """Flat int32 stream [N]: EOT + document tokens, for each document (prose repeated upsample_prose times)."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    parts = []
    for doc, ids in zip(docs, encode_documents(tokenizer, docs)):
        parts += [[eot] + ids] * (upsample_prose if doc.kind == "prose" else 1)
    return torch.tensor([t for p in parts for t in p], dtype=torch.int32)  # [N]


def sample_batch(stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator,
                 device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the stream: inputs x and next-token targets y, both [B, T] int64."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=generator)  # [B]
    idx = starts[:, None] + torch.arange(seq_len + 1)  # [B, T+1]
    chunk = stream[idx].long()  # [B, T+1]
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


def eval_chunks(stream: torch.Tensor, seq_len: int, max_chunks: int) -> torch.Tensor:
    """Consecutive non-overlapping windows [N, T+1] of a validation stream (deterministic)."""
    n = min(max_chunks, (len(stream) - 1) // seq_len)
    if n < 1:
        raise ValueError(f"validation stream of {len(stream)} tokens is shorter than one {seq_len}-token chunk")
    return torch.stack([stream[i * seq_len: i * seq_len + seq_len + 1].long() for i in range(n)])  # [N, T+1]


def heldout_prompts(tokenizer: PreTrainedTokenizerFast, corpus: Corpus, n: int, prompt_tokens: int = 48,
                    following_tokens: int = 0, stride: int = 512) -> list[HeldoutPrompt]:
    """Up to n prompts, alternating code and prose, spread evenly over the windows at token offsets
    0, stride, 2·stride … of every validation document (so file heads and file bodies in proportion to
    the text), each with the document's true next following_tokens tokens."""
    eot = tokenizer.convert_tokens_to_ids(EOT)
    per_kind = {}
    for kind in ("code", "prose"):
        docs = corpus.select("val", kind)
        windows = []
        for doc, ids in zip(docs, encode_documents(tokenizer, docs)):
            for off in range(0, max(len(ids) - prompt_tokens // 2, 1), stride):
                head = [eot] if off == 0 else []  # a file head starts where the model saw documents start
                full = head + ids[off: off + prompt_tokens + following_tokens - len(head)]
                if min(len(full), prompt_tokens) >= 8:
                    windows.append(HeldoutPrompt(kind, f"{doc.name}@{off}", tuple(full[:prompt_tokens]),
                                                 tuple(full[prompt_tokens:])))
        per_kind[kind] = windows
    take = {"code": (n + 1) // 2, "prose": n // 2}
    short = {k: max(take[k] - len(w), 0) for k, w in per_kind.items()}  # a kind with too few windows lends its share
    take = {"code": take["code"] + short["prose"], "prose": take["prose"] + short["code"]}
    spread = {k: [w[(i * len(w)) // m] for i in range(m)] if (m := min(take[k], len(w))) else []
              for k, w in per_kind.items()}
    mixed = [p for pair in zip(spread["code"], spread["prose"]) for p in pair]
    longer = max(spread.values(), key=len)
    return mixed + longer[len(mixed) // 2:]
