"""Generation from an export (`slidedp.generate`, `slidedp generate`): greedy decoding is exactly transformers'
own `generate`, prompts are formatted by the data pipeline's code in the format the export's job config names,
sampling is seeded, and the command reads prompts from its options or stdin and says what is wrong with a bad
model directory or setting."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slidedp import cli  # noqa: E402
from slidedp.config import JobConfig  # noqa: E402
from slidedp.data.formats import ALPACA_PROMPT, IGNORE, documents  # noqa: E402
from slidedp.generate import GenerateError, Generator, generate  # noqa: E402
from slidedp.persist.export import JOB_FILE, write_hf  # noqa: E402
from slidedp.step.model_adapter import ModelAdapter, load_hf_config  # noqa: E402

PROMPTS = ["3 + 4 =", "reverse: cat moon ->"]
NEW = 12


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A model this small decodes ten times faster on one thread than on threads that wait for busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> str:
    """An export of the tiny model (random weights scaled so the greedy answer is not one repeated token) as a
    prompt_completion job writes it: weights, tokenizer and the job config."""
    adapter = ModelAdapter(load_hf_config("tiny-qwen3"))
    g = torch.Generator().manual_seed(0)
    units = [torch.randn(u.numel, generator=g) * 0.3 for u in adapter.units]
    cfg = JobConfig.from_dict({"model": "tiny-qwen3",
                               "data": {"path": "demo:demo_sft.jsonl", "format": "prompt_completion"}})
    out = str(tmp_path_factory.mktemp("generate") / "final")
    written = write_hf(out, "tiny-qwen3", "fp32", adapter, units, cfg.to_dict())
    assert JOB_FILE in [f["name"] for f in written["files"]]
    return out


@pytest.fixture(scope="module")
def gen(export) -> Generator:
    return Generator(export, device="cpu")


def test_greedy_generation_equals_transformers_generate(export, gen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(export, local_files_only=True).eval()
    tok = AutoTokenizer.from_pretrained(export, local_files_only=True)
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            plain = model.generate(ids, max_new_tokens=NEW, do_sample=False)[0, ids.shape[1]:].tolist()
        out = gen(prompt, max_new_tokens=NEW)
        assert out.token_ids == plain and len(plain) > 1
        assert out.text == tok.decode(plain, skip_special_tokens=True)
        assert (out.prompt_tokens, out.new_tokens) == (ids.shape[1], len(plain))
        assert out.stop == ("eos" if plain[-1] == tok.eos_token_id else "length")
        assert out.stop == "eos" or len(plain) == NEW


def test_prompts_are_formatted_as_the_job_trained(export, gen):
    # The export's job config says prompt_completion: the prompt is read as it is, as training read it.
    assert gen.format == "prompt_completion"
    assert gen.format_prompt("3 + 4 =")[0] == "3 + 4 ="
    # Alpaca: the prompt is the instruction, rendered and tokenised exactly as the context of a training example.
    alpaca = Generator(export, "alpaca", "cpu")
    text, ids = alpaca.format_prompt("Add 3 and 4.")
    assert text == ALPACA_PROMPT.format(instruction="Add 3 and 4.", input_block="")
    doc = documents([{"instruction": "Add 3 and 4.", "output": "7"}], "alpaca", alpaca.tokenizer)[0]
    context = [t for t, label in zip(doc.ids, doc.labels) if label == IGNORE]
    assert ids == context
    # Chat: one user turn and the template's assistant header; the answer ends at the end-of-turn marker.
    chat = Generator(export, "chat", "cpu")
    text, _ = chat.format_prompt("hello")
    assert text == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert chat.tokenizer.convert_tokens_to_ids("<|im_end|>") in chat.stop_ids


def test_sampling_is_seeded(gen):
    a = gen(PROMPTS[0], max_new_tokens=NEW, temperature=1.5, seed=7)
    b = gen(PROMPTS[0], max_new_tokens=NEW, temperature=1.5, seed=7)
    greedy = gen(PROMPTS[0], max_new_tokens=NEW)
    assert a.token_ids == b.token_ids
    assert any(gen(PROMPTS[0], max_new_tokens=NEW, temperature=1.5, seed=s).token_ids != greedy.token_ids
               for s in range(3))
    with pytest.raises(GenerateError, match="temperature must be a finite number >= 0"):
        gen(PROMPTS[0], temperature=-1.0)


def test_generate_command_answers_prompts_from_options_and_stdin(export, gen, capsys, monkeypatch):
    expected = [gen(p, max_new_tokens=NEW).text for p in PROMPTS]
    assert [r.text for r in generate(export, PROMPTS, max_new_tokens=NEW, device="cpu")] == expected
    args = ["generate", "--model", export, "--max-new-tokens", str(NEW), "--device", "cpu"]
    assert cli.main([*args, "--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["text"] for r in records] == expected
    assert [(r["prompt"], r["formatted_prompt"], r["format"]) for r in records] == [
        (p, p, "prompt_completion") for p in PROMPTS]
    # One prompt a line on stdin, blank lines skipped; plain output is the answers.
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{PROMPTS[0]}\n\n{PROMPTS[1]}\n"))
    assert cli.main(args) == 0
    assert capsys.readouterr().out == "".join(t + "\n" for t in expected)


def test_generate_command_says_what_is_wrong(export, tmp_path, capsys):
    assert cli.main(["generate", "--model", str(tmp_path), "--prompt", "x"]) == 2
    assert "is not a model directory (no config.json)" in capsys.readouterr().err
    assert cli.main(["generate", "--model", export, "--prompt", "x", "--max-new-tokens", "0"]) == 2
    assert "max_new_tokens must be an integer from 1 to 4096, got 0" in capsys.readouterr().err
    assert cli.main(["generate", "--model", export, "--prompt", "x" * 5000, "--max-new-tokens", "8"]) == 2
    assert "positions the model takes; shorten the prompt" in capsys.readouterr().err


def test_the_demo_held_out_prompts_are_not_in_its_training_file():
    """scripts/demo_eval.py's exact-match rate is on prompts the demo never trained on."""
    from slidedp.data import demo_paths

    def rows(name: str) -> list[dict]:
        with open(demo_paths()[name], encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    held, trained = rows("demo_heldout.jsonl"), {r["prompt"] for r in rows("demo_sft.jsonl")}
    assert len(held) == 20 and len({r["prompt"] for r in held}) == 20
    assert [r["prompt"] for r in held if r["prompt"] in trained] == []
    for r in held:  # the demo's own tasks: the count after a number, or the words in reverse order
        if r["prompt"].startswith("reverse: "):
            words = r["prompt"][len("reverse: "):-len(" ->")].split()
            assert r["completion"] == " " + " ".join(reversed(words))
        else:
            assert r["completion"] == f" {int(r['prompt'].split()[1]) + 1}"


def test_an_empty_answer_says_why(export, capsys, monkeypatch):
    """A model whose first token is its end marker answers an empty string: the generation says so, and what to
    try, in the record and on the command's stderr. The tiny model's head is replaced by one that always picks EOS
    (zero weights, the EOS logit as its only bias), so the real forward and decoding run."""
    gen = Generator(export, device="cpu")
    eos = gen.tokenizer.eos_token_id
    head = gen.model.get_output_embeddings()
    picks_eos = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        picks_eos.weight.zero_()
        picks_eos.bias.zero_()
        picks_eos.bias[eos] = 10.0
    gen.model.set_output_embeddings(picks_eos)
    out = gen("3 + 4 =", max_new_tokens=NEW)
    assert (out.text, out.stop, out.new_tokens) == ("", "eos", 1)
    assert out.note.startswith("The model's first token was its end marker: it ended the answer at once")
    assert "prompt_completion" in out.note and "temperature above 0" in out.note
    assert gen("3 + 4 =", max_new_tokens=NEW, temperature=1.0, seed=1).note.count("temperature") == 0

    monkeypatch.setattr("slidedp.generate.Generator", lambda *a, **k: gen)
    assert cli.main(["generate", "--model", export, "--prompt", "3 + 4 ="]) == 0
    captured = capsys.readouterr()
    assert captured.out == "\n" and "its end marker" in captured.err


def test_a_cut_or_unprintable_answer_says_why():
    from slidedp.generate import explain

    assert explain("7", "eos", 2, 8, "prompt_completion", 0.0) is None
    assert explain("7 8 9", "length", 8, 8, "text", 0.0) == (
        "The answer was cut at max_new_tokens (8) before the model ended it; ask for more tokens to see the rest.")
    assert explain("  ", "eos", 4, 8, "text", 0.5).startswith(
        "The model generated 3 tokens that are all special tokens or white space, then its end marker")
    assert "reached max_new_tokens (8) without an end marker" in explain("", "length", 8, 8, "chat", 0.0)
