"""One widget per module; each is a view that receives core values and emits user intents."""
