"""Online distillation's stage of an RL step (`mode = "distill"`; the teacher is `teacher.py`).

Between advantages and the loss: the teacher scores every token the student sampled, which
adds a per-token advantage to each sample (and scales its RL advantage by reward_weight), so
the step's usual policy-gradient loss pulls the student toward the teacher.
"""

from __future__ import annotations

from workbench.train.distributed import DistInfo
from workbench.train.samples import Sample
from workbench.train.teacher import Teacher, TeacherStats


async def distill(
    teacher: Teacher, samples: list[Sample], temperature: float, dist: DistInfo
) -> dict[str, float]:
    """Score `samples` in place; returns distill/reverse_kl and distill/teacher_logprob over the
    sampled tokens of every rank (one all-reduce: every rank calls it)."""
    scored = await teacher.score(samples, temperature)
    kl_sum, teacher_sum, tokens = dist.sum([scored.reverse_kl_sum, scored.teacher_logprob_sum, scored.tokens])
    return TeacherStats(kl_sum, teacher_sum, int(tokens)).metrics()
