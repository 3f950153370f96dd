"""A room for compiled autograd: capture of the whole backward at .backward() time. Empty for now."""
