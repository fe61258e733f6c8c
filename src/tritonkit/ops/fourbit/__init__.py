"""4-bit linear layers: x times an NF4 or INT4 weight dequantized in registers, forward and input gradient."""
