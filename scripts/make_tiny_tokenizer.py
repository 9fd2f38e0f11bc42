"""Train the tiny byte-level BPE tokenizer shipped in runtime/slidedp/assets/tokenizer/ (512 tokens, offline).

    .venv/bin/python scripts/make_tiny_tokenizer.py

The tiny and demo presets (slidedp.presets.TINY_PRESETS) use it. Its training text is written here and by
scripts/make_demo_data.py, so the vocabulary covers the demo task and the words of the chat and alpaca
renderings. Byte-level: any text encodes (unknown characters fall back to bytes), and decode(encode(x)) == x.
Ids 0-4 are the special tokens; the size is exactly slidedp.presets.TINY_VOCAB, checked before writing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "scripts"))

from make_demo_data import demo_examples  # noqa: E402
from slidedp.presets import TINY_VOCAB  # noqa: E402

OUT = ROOT / "runtime" / "slidedp" / "assets" / "tokenizer"
SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]  # ids 0..4, as the tiny presets expect

# Chat rendering (ChatML-style): each turn is <|im_start|>role\ncontent<|im_end|>\n; the generation prompt
# opens an assistant turn. Written without whitespace control so every turn renders as a prefix of the next.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

PROSE = """\
The workbench trains a language model whose weights live in host memory and slide through the GPU one unit
at a time. Each step reads a batch of sequences, computes the loss, sends the gradients back to the host and
updates the weights with AdamW. The loss should fall as the model learns the task.
A user asks a question and the assistant gives a short answer. The system message sets the rules.
### Instruction:
Add the two numbers.
### Input:
3 and 4
### Response:
7
Count up by one, reverse a list of words, and add small numbers. The answer is written after the prompt.
Hello, world! This is a test of the tokenizer: numbers 0 1 2 3 4 5 6 7 8 9 10 100 2048, words, and marks.
"""


def corpus() -> list[str]:
    texts = [p + c for p, c in demo_examples()]
    texts += [f"user\n{p}\nassistant\n{c.strip()}" for p, c in demo_examples(300, seed=1)]
    return texts + PROSE.split("\n") * 20


def build() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def main() -> int:
    tok = build()
    size = tok.get_vocab_size(with_added_tokens=True)
    if size != TINY_VOCAB:
        print(f"trained {size} tokens, need exactly {TINY_VOCAB}: add training text", file=sys.stderr)
        return 1
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    OUT.mkdir(parents=True, exist_ok=True)
    tok.save(str(OUT / "tokenizer.json"))
    # Written by hand rather than by transformers' save_pretrained, so the files do not depend on the
    # transformers version that happens to run this script (4.x and 5.x both read these keys).
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1024,
        "chat_template": CHAT_TEMPLATE,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    specials = {k: config[k] for k in ("bos_token", "eos_token", "pad_token", "additional_special_tokens")}
    (OUT / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    print(f"wrote {OUT} ({size} tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
