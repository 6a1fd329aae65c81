"""Red-team tests: each guard attacked the way a reward-seeking policy would, and the outcome asserted."""
