"""Tools a rollout may call; model output is untrusted input to every one of them."""
