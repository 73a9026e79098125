"""Produce the real logs of ml-debug's second example set (examples/stacks/good/) by running the frameworks.

Not a test dependency: run once, in its own environment, and commit the small outputs:

    python3 -m venv /work/venv-mldebug
    /work/venv-mldebug/bin/pip install torch transformers trl lightning accelerate datasets
    /work/venv-mldebug/bin/python tools/make_mldebug_stack_logs.py --out ml-debug/examples/stacks/good

Every run is a few dozen CPU steps on a tiny randomly initialised model with a tokenizer built
here (nothing is loaded from a hub). Each framework writes its log as it does for any user:
the Hugging Face Trainer and TRL print their dict lines between tqdm bars (stdout and stderr are
captured together, carriage returns kept), Lightning's CSVLogger writes metrics.csv, and an
accelerate loop prints through `accelerator.print`. This machine's folders in warnings are
replaced by `/home/user/...`. The runs are (the broken twins in stacks/broken are copies with one
edit each, see examples/README.md):

- `trainer_clm.log`: transformers Trainer, causal LM on digit strings;
- `trainer_cls.log`: transformers Trainer, sequence classification with eval every 10 steps;
- `dpo_beta01.log`, `dpo_beta05.log`: TRL DPOTrainer at beta 0.1 and 0.5;
- `lightning_forecast_metrics.csv`: Lightning's metrics.csv, a GRU forecaster on a noisy sine;
- `lightning_classify_metrics.csv`: Lightning's metrics.csv, an MLP classifier;
- `accelerate_loop.log`: a plain PyTorch loop under accelerate.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB = ["[PAD]", "[UNK]", "[EOS]", *"0123456789", *"abcdefghijklmnopqrstuvwxyz", " "]


def tokenizer():
    """A character-level fast tokenizer made in memory, so no hub download is needed."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                   eos_token="[EOS]")
    return fast


def tiny_gpt2(num_labels: int | None = None):
    """A two-layer GPT-2 with 32-wide embeddings over the character vocabulary."""
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=len(VOCAB), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     pad_token_id=0, eos_token_id=2, bos_token_id=2)
    if num_labels:
        cfg.num_labels = num_labels
        return GPT2ForSequenceClassification(cfg)
    return GPT2LMHeadModel(cfg)


def digit_strings(n: int, seed: int) -> list[str]:
    """Counting sequences such as '3 4 5 6 7', learnable in a few dozen steps."""
    import random
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(0, 5)
        out.append(" ".join(str((start + k) % 10) for k in range(8)))
    return out


def run_trainer_clm(out: Path, work: Path) -> None:
    """transformers Trainer on a causal LM, 40 steps, a dict line every 2 steps."""
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments
    tok = tokenizer()
    data = Dataset.from_dict({"text": digit_strings(400, 0)}).map(
        lambda b: tok(b["text"], truncation=True, max_length=32), batched=True, remove_columns=["text"])
    args = TrainingArguments(output_dir=str(work / "clm"), max_steps=40, logging_steps=2,
                             per_device_train_batch_size=8, learning_rate=3e-3, report_to="none",
                             save_strategy="no", seed=0, warmup_steps=4, use_cpu=True)
    Trainer(model=tiny_gpt2(), args=args, train_dataset=data,
            data_collator=DataCollatorForLanguageModeling(tok, mlm=False)).train()


def run_trainer_cls(out: Path, work: Path) -> None:
    """transformers Trainer on a two-class sequence classifier with eval every 10 steps."""
    import random
    from datasets import Dataset
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments
    import numpy as np
    tok = tokenizer()
    rng = random.Random(1)
    texts, labels = [], []
    for _ in range(500):
        label = rng.randrange(2)
        letters = "abcde" if label else "vwxyz"
        texts.append("".join(rng.choice(letters) for _ in range(10)))
        labels.append(label)
    data = Dataset.from_dict({"text": texts, "label": labels}).map(
        lambda b: tok(b["text"], truncation=True, max_length=16), batched=True, remove_columns=["text"])
    split = data.train_test_split(test_size=0.2, seed=0)

    def accuracy(pred):
        return {"accuracy": float(np.mean(np.argmax(pred.predictions, -1) == pred.label_ids))}

    args = TrainingArguments(output_dir=str(work / "cls"), max_steps=40, logging_steps=2,
                             eval_strategy="steps", eval_steps=10, per_device_train_batch_size=16,
                             learning_rate=2e-3, report_to="none", save_strategy="no", seed=0, use_cpu=True)
    Trainer(model=tiny_gpt2(num_labels=2), args=args, train_dataset=split["train"],
            eval_dataset=split["test"], data_collator=DataCollatorWithPadding(tok),
            compute_metrics=accuracy).train()


def run_dpo(out: Path, work: Path, beta: float) -> None:
    """TRL DPOTrainer on preference pairs: the counting continuation is chosen over a shuffled one."""
    import random
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer
    tok = tokenizer()
    rng = random.Random(2)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for s in digit_strings(300, 3):
        prompt, cont = s[:7], s[7:]
        wrong = list(cont.replace(" ", ""))
        rng.shuffle(wrong)
        rows["prompt"].append(prompt)
        rows["chosen"].append(cont)
        rows["rejected"].append(" " + " ".join(wrong))
    args = DPOConfig(output_dir=str(work / f"dpo{beta}"), max_steps=30, logging_steps=2, beta=beta,
                     per_device_train_batch_size=8, learning_rate=1e-3, report_to="none",
                     save_strategy="no", seed=0, max_length=40, use_cpu=True)
    import copy
    model = tiny_gpt2()
    # A model built here has no hub path for TRL to load a reference from, so the frozen copy is given.
    DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=Dataset.from_dict(rows),
               processing_class=tok).train()


def run_lightning(out: Path, work: Path, kind: str) -> None:
    """Lightning with its CSVLogger: a GRU forecaster on a noisy sine, or an MLP classifier."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset
    torch.manual_seed(0)
    if kind == "forecast":
        t = torch.arange(0, 2000, dtype=torch.float32)
        series = torch.sin(t / 20) + 0.1 * torch.randn_like(t)
        windows = series.unfold(0, 33, 1)
        x, y = windows[:, :32, None], windows[:, 32]
        cut = int(0.8 * len(x))  # split by time: the validation windows come after the training ones
        train, val = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])
    else:
        x = torch.randn(1200, 8)
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
        train, val = TensorDataset(x[:1000], y[:1000]), TensorDataset(x[1000:], y[1000:])

    class Forecaster(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.gru = nn.GRU(1, 16, batch_first=True)
            self.head = nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.gru(x)[0][:, -1]).squeeze(-1)

        def training_step(self, batch, _):
            loss = nn.functional.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _):
            pred = self(batch[0])
            self.log("val_loss", nn.functional.mse_loss(pred, batch[1]))
            self.log("val_mae", (pred - batch[1]).abs().mean())

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))

        def training_step(self, batch, _):
            logits = self.net(batch[0])
            loss = nn.functional.cross_entropy(logits, batch[1])
            self.log("train_loss", loss)
            self.log("train_acc", (logits.argmax(-1) == batch[1]).float().mean())
            return loss

        def validation_step(self, batch, _):
            logits = self.net(batch[0])
            self.log("val_loss", nn.functional.cross_entropy(logits, batch[1]))
            self.log("val_acc", (logits.argmax(-1) == batch[1]).float().mean())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    model = Forecaster() if kind == "forecast" else Classifier()
    logger = CSVLogger(str(work / "lightning"), name=kind, version=0)
    trainer = L.Trainer(max_epochs=6, logger=logger, log_every_n_steps=5, accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True), DataLoader(val, batch_size=256))
    shutil.copy(Path(logger.log_dir) / "metrics.csv", out / f"lightning_{kind}_metrics.csv")


def run_accelerate(out: Path, work: Path) -> None:
    """A plain PyTorch loop prepared by accelerate, printing a line every 5 steps."""
    import torch
    from accelerate import Accelerator
    from torch import nn
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    x = torch.randn(2048, 16)
    y = x @ torch.randn(16, 1) + 0.1 * torch.randn(2048, 1)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    step = 0
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 5 == 0:
                accelerator.print(f"epoch {epoch} step {step} | loss {loss.item():.4f} | "
                                  f"grad_norm {float(norm):.3f} | lr {opt.param_groups[0]['lr']:.1e}")


RUNS = {
    "trainer_clm.log": run_trainer_clm,
    "trainer_cls.log": run_trainer_cls,
    "dpo_beta01.log": lambda out, work: run_dpo(out, work, 0.1),
    "dpo_beta05.log": lambda out, work: run_dpo(out, work, 0.5),
    "lightning_forecast": lambda out, work: run_lightning(out, work, "forecast"),
    "lightning_classify": lambda out, work: run_lightning(out, work, "classify"),
    "accelerate_loop.log": run_accelerate,
}


def main() -> int:
    """Run each framework in a child process of this script, its console captured as the user sees it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the logs (examples/stacks/good)")
    parser.add_argument("--only", help="comma-separated run names (default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        with tempfile.TemporaryDirectory() as work:
            RUNS[args.child](out, Path(work))
        return 0
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    for name in (args.only.split(",") if args.only else RUNS):
        cmd = [sys.executable, __file__, "--out", str(out), "--child", name]
        # One pipe for stdout and stderr, unbuffered: warnings, tqdm bars and dict lines interleave
        # as they do on the user's terminal under `2>&1 | tee`.
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        if proc.returncode:
            sys.stderr.write(proc.stdout.decode(errors="replace")[-3000:])
            print(f"{name}: failed (exit {proc.returncode})", file=sys.stderr)
            return 1
        if name.endswith(".log"):
            # Warnings name this machine's folders; the committed log names a user's instead.
            console = proc.stdout.replace(sys.prefix.encode(), b"/home/user/venv")
            console = console.replace(str(Path(__file__).resolve().parents[1]).encode(), b"/home/user/project")
            (out / name).write_bytes(console)
        print(f"{name}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
