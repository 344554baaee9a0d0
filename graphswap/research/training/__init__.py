"""The second floor of research: fine-tuning with the kernels in the loop, on top of data.

recovery (calibration data, BN re-estimation, bias compensation, the fine-tuning recipe),
distillation (fine-tuning without labels), finetune_checks (what finetune checks before and while
it trains), checkpoint_state, checkpoint_lock and checkpoints (one atomic checkpoint per epoch),
fingerprints (what ties a resumed run to its checkpoint), strategies (distribution strategies),
finetuning (the `finetune` entry point).  It imports only research.data below it.
"""
