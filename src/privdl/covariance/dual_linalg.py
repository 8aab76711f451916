"""The dense linear algebra under the dual solver (:mod:`privdl.covariance.dual`): symmetric eigendecompositions on
NumPy, SciPy (in place) or torch, B = diag(s) M diag(s), symmetrisation and triangle mirroring without n×n
temporaries, a Cholesky inverse, and Qᵀ diag(v) Q by symmetric rank-k updates.

Separate because these kernels choose the library per size (``SCIPY_MIN_N``: NumPy and SciPy ship separate OpenBLAS
builds whose thread pools slow each other down on small matrices) and manage memory at n in the thousands — a
concern of arithmetic, not of the iteration that calls them; the Newton step and the tie-break share them.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.linalg.blas import get_blas_funcs
from scipy.linalg.lapack import dpotrf, dpotri

from privdl.errors import ValidationError

#: From this n on, LAPACK and BLAS calls go through SciPy (in-place eigendecomposition, symmetric rank-k updates,
#: Cholesky inverse); below it through NumPy only: the two ship separate OpenBLAS builds, whose thread pools slow
#: each other down badly on small matrices when calls alternate.
SCIPY_MIN_N = 3000


def _eig(b_mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The original solver's eigendecomposition (kept verbatim for ``method="fixed_point"``)."""
    mu, q = np.linalg.eigh(b_mat)
    return np.sqrt(np.clip(mu, 0.0, None)), q


def _scaled(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """B = diag(s) M diag(s), in one new array."""
    b_mat = np.multiply(m, s[:, None])
    b_mat *= s[None, :]
    return b_mat


def _eigh(b_mat: np.ndarray, device: str | None) -> tuple[np.ndarray, np.ndarray]:
    """√eigenvalues (ascending, clipped at 0) and eigenvectors of the symmetric ``b_mat``, which may be overwritten."""
    if device is None and b_mat.shape[0] < SCIPY_MIN_N:
        mu, q = np.linalg.eigh(b_mat)
    elif device is None:  # (b_mat.T: the same symmetric matrix in Fortran order, so LAPACK works in place, no copy)
        mu, q = scipy.linalg.eigh(b_mat.T, overwrite_a=True, check_finite=False, driver="evd")
    else:
        import torch

        mu_t, q_t = torch.linalg.eigh(torch.from_numpy(b_mat).to(device))
        mu, q = mu_t.cpu().numpy(), q_t.cpu().numpy()
    return np.sqrt(np.clip(mu, 0.0, None)), q


def _symmetrised(a: np.ndarray) -> np.ndarray:
    """(A + Aᵀ)/2, in place (block by block: no n×n temporary)."""
    n, step = a.shape[0], 256
    for i in range(0, n, step):
        for j in range(i, n, step):
            upper = a[i:i + step, j:j + step]
            lower = a[j:j + step, i:i + step]
            mean = 0.5 * (upper + lower.T)
            upper[...] = mean
            lower[...] = mean.T
    return a


def _spd_inverse(a: np.ndarray) -> np.ndarray:
    """A⁻¹ for symmetric positive definite A (Cholesky: half the work of an LU inverse), overwriting A."""
    if a.shape[0] < SCIPY_MIN_N:
        return _symmetrised(np.linalg.inv(a))
    chol, info = dpotrf(a.T, lower=0, clean=1, overwrite_a=1)  # (a.T: Fortran order, in place)
    if info == 0:
        inv, info = dpotri(chol, lower=0, overwrite_c=1)
    if info != 0:  # (``a`` is overwritten by now: no fallback on it. A precision that is not positive definite
        # would give an R that is not a covariance: say so rather than invert what is left)
        raise ValidationError(f"the recovered precision matrix (n = {a.shape[0]}) is not positive definite to "
                              f"working precision (LAPACK info {info}); try a larger ridge")
    inv = _mirror_upper(inv, 256)  # dpotri fills one triangle: mirror it
    return inv.T if not inv.flags.c_contiguous else inv  # (symmetric: the transpose is the same matrix)


def _gram(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Qᵀ diag(v) Q = A₊ᵀA₊ − A₋ᵀA₋ (A± the rows of Q where ±v > 0, scaled by √|v|): two symmetric rank-k updates,
    half the work of a general product, one triangle then mirrored."""
    n = q.shape[1]
    if n < SCIPY_MIN_N:
        return (q * v[:, None]).T @ q
    syrk = get_blas_funcs("syrk", dtype=q.dtype)
    out = None
    for sign, rows in ((1.0, v > 0), (-1.0, v < 0)):
        if not rows.any():
            continue
        a = q[rows] * np.sqrt(np.abs(v[rows]))[:, None]  # C order: a.T is the Fortran matrix syrk wants
        if out is None:
            out = syrk(sign, a.T, trans=0, lower=1)  # Fortran n×n, lower triangle of AᵀA
        else:
            out = syrk(sign, a.T, beta=1.0, c=out, trans=0, lower=1, overwrite_c=1)
    if out is None:
        return np.zeros((n, n), dtype=q.dtype)
    return _mirror_upper(out.T, 512)  # (C order: the valid triangle is now the upper one)


def _mirror_upper(a: np.ndarray, block: int) -> np.ndarray:
    """Copy the upper triangle of square ``a`` onto its lower one, in place, tile by tile (no n×n temporary)."""
    n = a.shape[0]
    for i in range(0, n, block):
        for j in range(i, n, block):
            if i == j:
                tile = a[i:i + block, i:i + block]
                tile[...] = np.triu(tile) + np.triu(tile, 1).T
            else:
                a[j:j + block, i:i + block] = a[i:i + block, j:j + block].T
    return a
