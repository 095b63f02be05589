"""Exact retrieval over a memory spread across processes (`torch.distributed`): joining a process
group and opening this rank's shards (`group`), running a retrieval on every rank (`retrieve`),
and starting local worker processes without torchrun (`launch`). See docs/distributed.md."""
