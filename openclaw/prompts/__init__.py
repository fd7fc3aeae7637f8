"""The prompt library: named, versioned prompts ("system", "tools") from the store, which one a
user gets (pin > A/B variant > active version > the config's), and the label each assistant
message keeps of them. See docs/prompts.md."""

from openclaw.prompts.choice import PROMPT_NAMES, PromptChoice, PromptSource, choose, decide
from openclaw.prompts.labels import BUILTIN, CONFIG, make_label, parse_label

__all__ = ["BUILTIN", "CONFIG", "PROMPT_NAMES", "PromptChoice", "PromptSource", "choose", "decide",
           "make_label", "parse_label"]
