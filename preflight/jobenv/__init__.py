"""Pure parsers of what the job's environment says: CUDA_VISIBLE_DEVICES as CUDA reads it
(cuda_visible), NCCL's interface lists and MASTER_ADDR / MASTER_PORT (netvars), the torchrun / Slurm
launcher variables (launcher). No I/O: literal strings in, plain data out."""
