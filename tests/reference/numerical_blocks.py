"""Numpy oracle for survey §4.3 (Runge–Kutta sub-layers) and §5.4 (reversible layers)."""

# The survey's RK4 (§4.3) and the second-order methods, written out stage by stage.


def runge_kutta_step(z, fs, method, h=1.0, gammas=None):
    """`z + Σ_i γ_i g_i` with `g_i = h f_i(z + Σ_j β_ij g_j)`; `fs` one function per stage
    (the same one repeated when the weights are shared). `gammas` replaces the method's
    `γ` (learned coefficients)."""
    if method == "euler":
        g = [h * fs[0](z)]
        default = [1.0]
    elif method == "rk2":  # Heun: g2 = h f(z + g1), z + (g1 + g2) / 2
        g1 = h * fs[0](z)
        g = [g1, h * fs[1](z + g1)]
        default = [0.5, 0.5]
    elif method == "rk2_midpoint":  # g2 = h f(z + g1 / 2), z + g2
        g1 = h * fs[0](z)
        g = [g1, h * fs[1](z + 0.5 * g1)]
        default = [0.0, 1.0]
    elif method == "rk4":  # survey §4.3
        g1 = h * fs[0](z)
        g2 = h * fs[1](z + 0.5 * g1)
        g3 = h * fs[2](z + 0.5 * g2)
        g4 = h * fs[3](z + g3)
        g = [g1, g2, g3, g4]
        default = [1 / 6, 2 / 6, 2 / 6, 1 / 6]
    else:
        raise ValueError(method)
    gammas = default if gammas is None else gammas
    return z + sum(gamma * gi for gamma, gi in zip(gammas, g))


def reversible_layer(x1, x2, f, g):
    """`y1 = x1 + F(x2)`, `y2 = x2 + G(y1)` (Gomez et al. 2017)."""
    y1 = x1 + f(x2)
    return y1, x2 + g(y1)


def reversible_inverse(y1, y2, f, g):
    """`x2 = y2 − G(y1)`, `x1 = y1 − F(x2)`."""
    x2 = y2 - g(y1)
    return y1 - f(x2), x2


def reversible_stack(h, layers, norm):
    """`[x1, x2] = [H, H]`, the layers `(F_l, G_l)` in turn, `LNorm((x1 + x2) / 2)`."""
    x1, x2 = h, h
    for f, g in layers:
        x1, x2 = reversible_layer(x1, x2, f, g)
    return norm((x1 + x2) / 2)
