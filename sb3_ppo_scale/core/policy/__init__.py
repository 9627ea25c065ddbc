"""The policy's own operations without module dispatch or Distribution objects, bit-identical to SB3's: one
collection step (:mod:`~.inference`) and the evaluation of a micro-batch in the loss (:mod:`~.evaluation`). Both
halves of the core use them."""
