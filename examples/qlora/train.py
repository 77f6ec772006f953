"""QLoRA fine-tuning of Qwen2.5-7B-Instruct on Alpaca, run by the NomadGPU agent: the field
report's job (see README.md beside this file). (One file over 500 lines on purpose: a user
copies one training script into their own repository, whole.)

The model is loaded in 4-bit (bitsandbytes NF4, double quantisation, bf16 compute), LoRA
adapters (peft) are trained on every linear projection by the Hugging Face ``Trainer`` (or, with
``--trainer sft``, by TRL's ``SFTTrainer``, the usual QLoRA entry point), and
``agent.hf.NomadCallback`` follows the checkpoint protocol: progress and loss go to the agent,
every ``checkpoint-<step>`` the Trainer writes under ``$NOMAD_CHECKPOINT_DIR`` is marked ready
and uploaded, and a ``checkpoint_now`` from the supervisor makes the Trainer save at the end of
the current step. A replacement host resumes from ``$NOMAD_RESUME_FROM`` (model, optimizer,
scheduler, RNG and data position), so ``global_step`` continues where the checkpoint left off.

Every setting is a flag or an environment variable (the flag wins)::

    --model        QLORA_MODEL        Qwen/Qwen2.5-7B-Instruct
    --dataset      QLORA_DATASET      yahma/alpaca-cleaned
    --steps        QLORA_STEPS        $NOMAD_TOTAL_STEPS, else 300
    --save-steps   QLORA_SAVE_STEPS   50
    --batch-size   QLORA_BATCH_SIZE   4     (per step: batch size x grad accumulation sequences)
    --grad-accum   QLORA_GRAD_ACCUM   4
    --lr           QLORA_LR           2e-4
    --max-length   QLORA_MAX_LENGTH   512   (tokens per sequence, longer ones are cut)
    --lora-r       QLORA_LORA_R       16
    --seed         QLORA_SEED         42
    --trainer      QLORA_TRAINER      hf    (hf: transformers' Trainer; sft: TRL's SFTTrainer)
    --step-seconds QLORA_STEP_SECONDS 0     (a pause after each step: the tiny model trains
                                             300 steps in seconds, too fast for a drill)
    --tiny         QLORA_TINY=1       a tiny random Qwen2 and a synthetic data set on the CPU

``--tiny`` needs torch, transformers and peft only (``--trainer sft`` adds trl and datasets): no
GPU, no bitsandbytes and no download. It exercises the same trainer, LoRA, checkpoint and
resume code in seconds; the project's tests run it under the real agent.

Output: ``resuming from <dir> at step <n>`` when resuming, the trainer's log lines, and last
``finished at step <n>, adapter sha256 <hex>``: the digest of the trained LoRA weights, equal
for a run that was interrupted and resumed and one that was not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
IGNORE = -100  # label of a token that does not count towards the loss
TINY_ROWS = 512
TINY_PROMPT = "### Instruction:\n{instruction}\n\n### Response:\n"
# Qwen2.5's turn format, for the tiny tokenizer: SFTTrainer renders conversations through it.
TINY_CHAT_TEMPLATE = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def env(name: str, default: Any) -> Any:
    """The environment variable NAME, or DEFAULT when it is unset or empty."""
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The settings: flags first, then QLORA_* variables, then the defaults above."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=env("QLORA_MODEL", "Qwen/Qwen2.5-7B-Instruct"))
    p.add_argument("--dataset", default=env("QLORA_DATASET", "yahma/alpaca-cleaned"))
    p.add_argument(
        "--steps", type=int, default=int(env("QLORA_STEPS", env("NOMAD_TOTAL_STEPS", 300)))
    )
    p.add_argument("--save-steps", type=int, default=int(env("QLORA_SAVE_STEPS", 50)))
    p.add_argument("--batch-size", type=int, default=int(env("QLORA_BATCH_SIZE", 4)))
    p.add_argument("--grad-accum", type=int, default=int(env("QLORA_GRAD_ACCUM", 4)))
    p.add_argument("--lr", type=float, default=float(env("QLORA_LR", 2e-4)))
    p.add_argument("--lr-scheduler", default=env("QLORA_LR_SCHEDULER", "cosine"))
    p.add_argument("--warmup-steps", type=int, default=int(env("QLORA_WARMUP_STEPS", 10)))
    p.add_argument("--max-length", type=int, default=int(env("QLORA_MAX_LENGTH", 512)))
    p.add_argument("--lora-r", type=int, default=int(env("QLORA_LORA_R", 16)))
    p.add_argument("--lora-alpha", type=int, default=int(env("QLORA_LORA_ALPHA", 32)))
    p.add_argument("--lora-dropout", type=float, default=float(env("QLORA_LORA_DROPOUT", 0.05)))
    p.add_argument("--logging-steps", type=int, default=int(env("QLORA_LOGGING_STEPS", 1)))
    p.add_argument("--seed", type=int, default=int(env("QLORA_SEED", 42)))
    p.add_argument(
        "--output-dir",
        default=env("NOMAD_CHECKPOINT_DIR", "qlora-checkpoints"),
        help="where checkpoint-<step> folders go (default $NOMAD_CHECKPOINT_DIR)",
    )
    p.add_argument(
        "--resume-from",
        default=env("NOMAD_RESUME_FROM", None),
        help="a checkpoint folder to resume from (default $NOMAD_RESUME_FROM)",
    )
    p.add_argument(
        "--trainer",
        choices=["hf", "sft"],
        default=env("QLORA_TRAINER", "hf"),
        help="hf: transformers' Trainer; sft: TRL's SFTTrainer",
    )
    p.add_argument("--step-seconds", type=float, default=float(env("QLORA_STEP_SECONDS", 0)))
    p.add_argument(
        "--tiny",
        action="store_true",
        default=env("QLORA_TINY", "0").lower() not in ("0", "false", "no", ""),
        help="tiny random Qwen2 + synthetic data on the CPU: nothing is downloaded",
    )
    args = p.parse_args(argv)
    if args.steps < 1 or args.save_steps < 1:
        p.error("--steps and --save-steps must be positive")
    if args.step_seconds < 0:
        p.error("--step-seconds must not be negative")
    return args


# --- data ---------------------------------------------------------------------------------


@dataclass
class Encoder:
    """Text to token ids for prompts and answers, and the ids the collator needs."""

    encode: Callable[[str], list[int]]
    render: Callable[[str, str], tuple[str, str]]  # (user text, answer) -> (prompt, answer)
    pad_id: int
    eos_id: int | None


def user_text(row: dict[str, str]) -> str:
    """An Alpaca row's instruction, and its input (when it has one) after a blank line."""
    instruction = (row.get("instruction") or "").strip()
    extra = (row.get("input") or "").strip()
    return f"{instruction}\n\n{extra}" if extra else instruction


def encode_row(row: dict[str, str], enc: Encoder, max_length: int) -> dict | None:
    """Prompt and answer as one sequence of at most MAX_LENGTH tokens; only the answer's
    tokens are learnt. None when the prompt alone fills MAX_LENGTH (nothing to learn)."""
    prompt, answer = enc.render(user_text(row), (row.get("output") or "").strip())
    prompt_ids = enc.encode(prompt)
    answer_ids = enc.encode(answer)
    if enc.eos_id is not None:
        answer_ids.append(enc.eos_id)
    if len(prompt_ids) >= max_length:
        return None
    input_ids = (prompt_ids + answer_ids)[:max_length]
    labels = ([IGNORE] * len(prompt_ids) + answer_ids)[:max_length]
    return {"input_ids": input_ids, "labels": labels}


class InstructionData:
    """Rows tokenized when the Trainer asks for them (no pass over the whole data set first).

    Its length and order do not depend on the step count, so a resumed run (possibly told a
    different ``--steps``) sees the same batches as an uninterrupted one and the Trainer's
    skipping of already-trained batches lines up. A row that cannot fit is replaced by the
    next one that can.
    """

    def __init__(self, rows: Sequence[dict[str, str]], enc: Encoder, max_length: int) -> None:
        self.rows, self.enc, self.max_length = rows, enc, max_length

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        count = len(self.rows)
        for offset in range(count):
            example = encode_row(self.rows[(index + offset) % count], self.enc, self.max_length)
            if example is not None:
                return example
        raise ValueError("no row fits in --max-length tokens")


class PadCollator:
    """Right-pads a batch to its longest sequence; padding is masked out and never learnt."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, features: list[dict]) -> dict:
        import torch

        width = max(len(f["input_ids"]) for f in features)
        batch: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
        for f in features:
            pad = width - len(f["input_ids"])
            batch["input_ids"].append(f["input_ids"] + [self.pad_id] * pad)
            batch["attention_mask"].append([1] * len(f["input_ids"]) + [0] * pad)
            batch["labels"].append(f["labels"] + [IGNORE] * pad)
        return {name: torch.tensor(rows, dtype=torch.long) for name, rows in batch.items()}


def synthetic_rows(count: int, seed: int) -> list[dict[str, str]]:
    """Alpaca-shaped rows about small sums, made up in memory (for --tiny)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        rows.append({"instruction": "Add the numbers.", "input": f"{a}+{b}", "output": f"{a + b}"})
    return rows


def prompt_completion(row: dict[str, str]) -> dict[str, list[dict[str, str]]]:
    """An Alpaca row as TRL's conversational prompt-completion example: SFTTrainer renders
    both turns with the tokenizer's chat template and learns only the completion."""
    return {
        "prompt": [{"role": "user", "content": user_text(row)}],
        "completion": [{"role": "assistant", "content": (row.get("output") or "").strip()}],
    }


def byte_encoder() -> Encoder:
    """UTF-8 bytes as tokens (vocabulary 256): the tiny model needs no tokenizer files."""

    def render(user: str, answer: str) -> tuple[str, str]:
        return TINY_PROMPT.format(instruction=user), answer

    return Encoder(encode=lambda text: list(text.encode()), render=render, pad_id=0, eos_id=0)


def chat_encoder(tokenizer: Any) -> Encoder:
    """The model's own chat template (Qwen's ``<|im_start|>`` turns), answer = assistant turn."""

    def render(user: str, answer: str) -> tuple[str, str]:
        turn = [{"role": "user", "content": user}]
        prompt = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(
            [*turn, {"role": "assistant", "content": answer}], tokenize=False
        )
        if full.startswith(prompt):
            return prompt, full[len(prompt) :]  # the answer with the template's end-of-turn
        return prompt, answer

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    return Encoder(encode=encode, render=render, pad_id=pad_id, eos_id=None)


# --- model --------------------------------------------------------------------------------


def lora_config(args: argparse.Namespace) -> Any:
    from peft import LoraConfig

    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=LORA_TARGETS,
        bias="none",
        task_type="CAUSAL_LM",
    )


def tiny_base_model(args: argparse.Namespace, tokenizer: Any = None) -> Any:
    """A randomly initialised two-layer Qwen2 on the CPU, the same weights on every host: for
    TOKENIZER's vocabulary and special tokens, or for bytes (id 0 special) without one."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab, pad, eos = (256, 0, 0) if tokenizer is None else (
        len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id
    )  # fmt: skip
    config = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=vocab,
        max_position_embeddings=max(args.max_length, 256),
        pad_token_id=pad,
        bos_token_id=eos if tokenizer is None else None,
        eos_token_id=eos,
        tie_word_embeddings=True,
    )
    torch.manual_seed(args.seed)  # the same base weights on every host: adapters fit them
    return Qwen2ForCausalLM(config)


def tiny_model_and_data(args: argparse.Namespace) -> tuple[Any, InstructionData, Encoder]:
    """The tiny Qwen2 (byte vocabulary) with LoRA adapters, and made-up data, on the CPU."""
    from peft import get_peft_model

    model = get_peft_model(tiny_base_model(args), lora_config(args))
    enc = byte_encoder()
    return model, InstructionData(synthetic_rows(TINY_ROWS, args.seed), enc, args.max_length), enc


def tiny_tokenizer() -> Any:
    """A byte-level tokenizer built in memory with Qwen's special tokens and turn format: what
    SFTTrainer needs from a tokenizer, without a download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def quantized_base_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The base model in 4-bit NF4 on the GPU, ready for k-bit training, and its tokenizer."""
    import torch

    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU visible: 4-bit QLoRA needs one (try --tiny on a CPU)")
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    quantization = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    model = AutoModelForCausalLM.from_pretrained(
        args.model, quantization_config=quantization, dtype=torch.bfloat16, device_map={"": 0}
    )
    model = prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=True,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
    return model, tokenizer


def qlora_model_and_data(args: argparse.Namespace) -> tuple[Any, InstructionData, Encoder]:
    """The 4-bit base model with LoRA adapters, and the instruction data."""
    from datasets import load_dataset
    from peft import get_peft_model

    base, tokenizer = quantized_base_model(args)
    model = get_peft_model(base, lora_config(args))
    model.print_trainable_parameters()

    enc = chat_encoder(tokenizer)
    rows = load_dataset(args.dataset, split="train")  # the Trainer's seeded sampler shuffles
    return model, InstructionData(rows, enc, args.max_length), enc


# --- training -----------------------------------------------------------------------------


def checkpoint_step(path: str) -> int:
    """The step of the Trainer checkpoint in PATH (exits when PATH is not one)."""
    state = Path(path) / "trainer_state.json"
    if not state.is_file():
        sys.exit(f"{path} is not a Trainer checkpoint: no trainer_state.json")
    return int(json.loads(state.read_text())["global_step"])


def checkpointing_flag() -> str:
    """transformers 5.23 renamed ``gradient_checkpointing`` (kept as a deprecated alias); the
    GPU setup's 5.19, the newest that runs on the image's torch 2.5.1, knows only the old name."""
    from transformers import TrainingArguments

    new = "activation_checkpointing"
    return new if new in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing"


def training_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments both trainers take (``TrainingArguments``; ``SFTConfig`` extends it).

    Given in full so that SFTConfig's own defaults (bf16, activation checkpointing, logging
    every 10 steps, another learning rate) do not make the two trainers train differently."""
    return {
        "output_dir": args.output_dir,  # the agent watches it: checkpoint-<step> folders go here
        "max_steps": args.steps,
        "save_strategy": "steps",
        "save_steps": args.save_steps,
        "save_total_limit": None,  # never delete a checkpoint the agent may still be uploading
        "logging_steps": args.logging_steps,
        "per_device_train_batch_size": args.batch_size,
        "gradient_accumulation_steps": args.grad_accum,
        "learning_rate": args.lr,
        "lr_scheduler_type": args.lr_scheduler,
        "warmup_steps": args.warmup_steps,
        "seed": args.seed,
        "use_cpu": args.tiny,
        "bf16": not args.tiny,
        "optim": "adamw_torch" if args.tiny else "paged_adamw_8bit",
        checkpointing_flag(): not args.tiny,  # recompute activations: less GPU memory
        "dataloader_num_workers": 0,
        "disable_tqdm": True,  # one log line per logging step reads better in the job's log
        "report_to": "none",
    }


def hf_trainer(args: argparse.Namespace, callbacks: list[Any]) -> Any:
    """transformers' Trainer on our own tokenized data and padding collator."""
    from transformers import Trainer, TrainingArguments

    build = tiny_model_and_data if args.tiny else qlora_model_and_data
    model, data, enc = build(args)
    return Trainer(
        model=model,
        args=TrainingArguments(**training_settings(args), remove_unused_columns=False),
        train_dataset=data,
        data_collator=PadCollator(enc.pad_id),
        callbacks=callbacks,
    )


def sft_data(args: argparse.Namespace) -> Any:
    """The instruction rows as a ``datasets.Dataset`` of prompt-completion conversations."""
    import datasets

    datasets.disable_progress_bars()  # tqdm's redraws would fill the job's log tail
    if args.tiny:
        rows = synthetic_rows(TINY_ROWS, args.seed)
        return datasets.Dataset.from_list([prompt_completion(row) for row in rows])
    rows = datasets.load_dataset(args.dataset, split="train")
    return rows.map(prompt_completion, remove_columns=rows.column_names)


def sft_trainer(args: argparse.Namespace, callbacks: list[Any]) -> Any:
    """TRL's SFTTrainer: it applies the chat template, masks the prompt out of the loss and
    wraps the base model in the LoRA adapters of ``peft_config`` itself."""
    from trl import SFTConfig, SFTTrainer

    if args.tiny:
        tokenizer = tiny_tokenizer()
        model = tiny_base_model(args, tokenizer)
    else:
        model, tokenizer = quantized_base_model(args)
    config = SFTConfig(**training_settings(args), max_length=args.max_length)
    return SFTTrainer(
        model=model,
        args=config,
        train_dataset=sft_data(args),
        processing_class=tokenizer,
        peft_config=lora_config(args),
        callbacks=callbacks,
    )


def pace(args: argparse.Namespace) -> list[Any]:
    """A callback that pauses ``--step-seconds`` after each step (none without the flag): a
    sandbox drill needs a run that lasts long enough to be interrupted."""
    if args.step_seconds <= 0:
        return []
    from transformers import TrainerCallback

    class Pace(TrainerCallback):  # type: ignore[misc, valid-type]
        def on_step_end(self, *_: Any, **__: Any) -> None:
            time.sleep(args.step_seconds)

    return [Pace()]


def adapter_digest(model: Any) -> str:
    """sha256 of the trainable (LoRA) weights, by name: equal digests, equal adapters."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if param.requires_grad:
            digest.update(name.encode())
            # float32 holds bf16 exactly, and numpy has no bf16
            digest.update(param.detach().cpu().float().contiguous().numpy().tobytes())
    return digest.hexdigest()


def announce(args: argparse.Namespace) -> None:
    """One line saying what runs, and from where it resumes."""
    from agent import AUTO, checkpoint_mode

    auto = checkpoint_mode() == AUTO
    schedule = "when the supervisor asks" if auto else f"every {args.save_steps} steps"
    print(
        f"qlora: {'tiny random Qwen2 on the CPU' if args.tiny else args.model}, "
        f"data {'synthetic' if args.tiny else args.dataset}, {args.steps} steps "
        f"with {'SFTTrainer' if args.trainer == 'sft' else 'Trainer'}, "
        f"checkpoint {schedule} into {args.output_dir}",
        flush=True,
    )
    if args.resume_from:
        print(f"resuming from {args.resume_from} at step {checkpoint_step(args.resume_from)}")


def main(argv: Sequence[str] | None = None, *, extra_callbacks: Sequence[Any] = ()) -> int:
    """Train, resuming from ``--resume-from`` when given. EXTRA_CALLBACKS run after
    ``NomadCallback`` (the project's tests hold training at a step with one)."""
    args = parse_args(argv)
    from agent.hf import NomadCallback

    announce(args)
    build = sft_trainer if args.trainer == "sft" else hf_trainer
    trainer = build(args, [NomadCallback(), *pace(args), *extra_callbacks])
    trainer.train(resume_from_checkpoint=args.resume_from or None)
    digest = adapter_digest(trainer.model)
    print(f"finished at step {trainer.state.global_step}, adapter sha256 {digest}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
