"""Root-cause triage of train vs rollout dump comparisons (reads output_1..4, writes output_5)."""
