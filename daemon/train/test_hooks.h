/*
 * test_hooks.h — faults for tests only, not part of trainer.h's interface:
 * m6d never arms them itself. Unit tests call trainer_test_fault; the
 * daemon's integration tests and bench/crash_soak arm the same faults
 * through the environment of m6d (M6_TEST_FAULT, read by trainer_create).
 */
#ifndef M6_TRAIN_TEST_HOOKS_H
#define M6_TRAIN_TEST_HOOKS_H

#include "train/trainer.h"

typedef enum {
    TRAINER_FAULT_NONE = 0,
    /* the step's batch is "bad": its loss is NaN and every gradient NaN
     * (the loss scale of its microbatches is NaN) */
    TRAINER_FAULT_NAN_BATCH,
    /* one element of slot `slot`'s gradient is +Inf once the step's
     * gradients are final (resident or offloaded slot alike); the loss
     * stays finite, the global norm is Inf. CPU backend only (a no-op on
     * cuda). Set on the rank's summed gradient (after a data-parallel
     * all-reduce): a fault of that rank alone, which NAN_BATCH is not */
    TRAINER_FAULT_INF_GRAD,
    /* this rank's own gradient is TRAINER_FAULT_GRAD_SCALE_FACTOR times
     * what it would be (the microbatches' loss scale times it), before
     * any data-parallel sum; the loss stays as it is. A rank whose
     * gradient norm stands out (step_result.outlier_rank) */
    TRAINER_FAULT_GRAD_SCALE,
    /* the whole process stops itself (raise SIGSTOP) once the step's
     * batches are read and agreed, before its forward: in an
     * expert-parallel run, before its first all-to-all, which the other
     * ranks enter and wait in (a rank frozen inside the exchange; SIGCONT
     * lets it go on). Once per process: a run rebuilt from a checkpoint
     * trains past the step */
    TRAINER_FAULT_STOP_A2A,
} trainer_fault;

/* TRAINER_FAULT_GRAD_SCALE's factor: far over GRAD_OUTLIER_RATIO. */
#define TRAINER_FAULT_GRAD_SCALE_FACTOR 1000.0f

/* Arm fault kind for the `count` steps numbered first..first+count-1
 * (1-based, as step_result.step); slot: TRAINER_FAULT_INF_GRAD's slot.
 * TRAINER_FAULT_NONE disarms. */
void trainer_test_fault(trainer *t, trainer_fault kind, long first,
                        long count, int slot);

/* The environment form, M6_TEST_FAULT="KIND@FIRST[xCOUNT][/SLOT]" with
 * KIND nan_batch, inf_grad, grad_scale or stop_a2a, e.g. "nan_batch@4x3" (steps 4,
 * 5, 6) or "inf_grad@2/1". Parsed into the arguments of
 * trainer_test_fault: 0, or -1 when text is not of that form. With
 * M6_TEST_FAULT_RANK=R as well, only the trainer of rank R (of its group)
 * takes the fault: one rank among several of an m6d (--devices N). */
int trainer_test_fault_parse(const char *text, trainer_fault *kind,
                             long *first, long *count, int *slot);

/* trainer_adopt_grad_group without its check that dev reduces device
 * memory: for the CUDA emulation, where device memory is host memory, so
 * that a Gloo group can sum the cuda backend's device buffer and the NCCL
 * path of the trainer (backend.h device_grads) runs without NCCL. Never
 * with a real GPU (Gloo would read device pointers). */
int trainer_test_adopt_grad_group(trainer *t, m6_coll *dev, m6_err *err);

#endif /* M6_TRAIN_TEST_HOOKS_H */
