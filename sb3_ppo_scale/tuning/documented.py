"""The documented sensitivity table (seed digest, post 001) that our measurement is printed beside."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DocumentedRow:
    """One row of the documented table: the ScalablePPO argument it is about and what the post claims."""

    argument: str
    label: str
    range: str
    stars: int
    advice: str


DOCUMENTED: tuple[DocumentedRow, ...] = (
    DocumentedRow("clip_range", "clip epsilon", "0.1-0.3", 4, "small for continuous control, larger for sparse rewards"),
    DocumentedRow("learning_rate", "learning rate", "1e-4 to 3e-4", 3, "use linear decay"),
    DocumentedRow("gae_lambda", "GAE lambda", "0.9-0.99", 2, "lower for more stochastic environments"),
    DocumentedRow("batch_size", "batch size", "64-4096", 2, "as large as GPU memory allows"),
    DocumentedRow("n_epochs", "update epochs", "3-10", 2, "tune together with epsilon"),
)


def documented_row(argument: str) -> DocumentedRow | None:
    """The documented row for a ScalablePPO argument, or None when the table does not list it."""
    return next((row for row in DOCUMENTED if row.argument == argument), None)
