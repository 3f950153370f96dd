"""What the backward must replay of the forward: double backward (double_backward), random values
(random_values), custom autograd.Functions (custom_functions)."""
