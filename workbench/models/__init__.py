"""Model building: the byte-level tokenizer and the embedded tiny chat model.

Nothing here imports torch at module import; the builders import it when called.
"""
