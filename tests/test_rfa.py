"""RFA's features against the RFA paper's definition (Peng et al., 2021, Eqs. 2-4): for unit vectors, random
Fourier features sqrt(1/D) [sin(W x / tau), cos(W x / tau)], W ~ N(0, I), estimate the Gaussian kernel
exp(-||x - y||^2 / (2 tau^2)) = exp((x . y - 1) / tau^2), a constant times exp(x . y / tau^2): softmax attention's
kernel on unit queries and keys at temperature tau^2. (At tau = 1, log_tau's start, the kernel of unit vectors lies in
[e^-2, 1]: attention weights within a factor of 7.4 of each other until tau is learned down, where a softmax teacher's
span orders of magnitude; the study's weak RFA rows may start there.)

    python -m pytest -q -s tests/test_rfa.py
"""

import math

import pytest
import torch

from conftest import report
from t2r import RFAFeatureMap

D = 20_000  # random projections: the estimate's standard deviation is about 1 / sqrt(2 D) = 0.005


@pytest.mark.parametrize("tau", [1.0, 0.5])
def test_rfa_features_estimate_the_gaussian_kernel_of_unit_vectors(tau):
    torch.manual_seed(0)
    rfa = RFAFeatureMap(n_head=1, d_head=16, feature_size=2 * D).double()
    with torch.no_grad():
        rfa.log_tau.fill_(math.log(tau))
        rfa.omega.normal_()
    x, y = torch.randn(2, 1, 1, 6, 16, dtype=torch.float64)  # 6 queries, 6 keys of one head
    fx, fy = rfa.eval()(x, y)
    estimate = (fx[0, 0] @ fy[0, 0].T)  # (6, 6): phi(x_i) . phi(y_j)
    unit = lambda v: v[0, 0] / v[0, 0].norm(dim=-1, keepdim=True)
    kernel = torch.exp((unit(x) @ unit(y).T - 1) / tau ** 2)  # exp(-||x^ - y^||^2 / (2 tau^2))
    assert report(f"tau {tau}: phi(x) . phi(y) - Gaussian kernel", (estimate - kernel).abs().max()) < 0.03  # 6 sigma

