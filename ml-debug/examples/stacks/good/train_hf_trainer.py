"""Sequence classification with the Hugging Face Trainer, a class-weighted loss and torch.compile."""
import torch
import torch.nn.functional as F
from datasets import load_dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments

MODEL = "distilroberta-base"
tokenizer = AutoTokenizer.from_pretrained(MODEL)
data = load_dataset("csv", data_files={"train": "data/train.csv", "validation": "data/val.csv"})
data = data.map(lambda b: tokenizer(b["text"], truncation=True, max_length=128), batched=True)
counts = torch.bincount(torch.tensor(data["train"]["label"]), minlength=4).float()
class_weights = counts.sum() / (len(counts) * counts)  # rare intents count as much as common ones


class WeightedTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = F.cross_entropy(outputs.logits, labels, weight=class_weights.to(outputs.logits.device))
        return (loss, outputs) if return_outputs else loss


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


model = AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=4)
args = TrainingArguments(output_dir="out/intent", learning_rate=2e-5, num_train_epochs=3,
                         per_device_train_batch_size=32, eval_strategy="steps", eval_steps=200,
                         logging_steps=20, torch_compile=True, report_to="none", seed=0)
trainer = WeightedTrainer(model=model, args=args, train_dataset=data["train"],
                          eval_dataset=data["validation"], processing_class=tokenizer,
                          compute_metrics=accuracy)
trainer.train()
