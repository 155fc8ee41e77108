"""Records and the text they hold (SPEC section 2): reading, tokenising and batching records, long documents as
windows, a record's secrets and distinctive words, counterfactual text, and the synthetic sets tests and demos use."""
