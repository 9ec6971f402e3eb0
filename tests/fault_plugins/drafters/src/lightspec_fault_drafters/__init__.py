"""lightspec-fault-drafters: strategies that misbehave: raise midway, float ids, mutated sequences, bad probabilities, ids past the vocabulary (tests only)."""
