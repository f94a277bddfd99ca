"""On-disk records: results.jsonl (one rollout a line), metadata.json (status + summary)."""
