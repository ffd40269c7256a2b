"""A simulated cluster: N engines behind a router on one virtual clock, optionally with
prefill and decode on separate replicas (see ``loop``)."""
