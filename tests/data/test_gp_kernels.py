"""``jittered_cholesky`` of the synthetic GP tasks: the factor of the matrix it returns, and its error."""

import pytest
import torch

from gridtnp.data.synthetic.gp_kernels import jittered_cholesky


def test_the_returned_matrix_is_the_one_factorised_with_the_jitter_it_needed():
    fine = torch.eye(3, dtype=torch.float64)[None] * 2.0
    short = torch.diag(torch.tensor([1.0, 1.0, -1e-9], dtype=torch.float64))[None]  # singular with the jitter
    cov = torch.cat([fine, short])
    chol, used = jittered_cholesky(cov, 1e-9)
    torch.testing.assert_close(chol @ chol.mT, used)
    torch.testing.assert_close(used, cov + 1e-8 * torch.eye(3, dtype=torch.float64))  # ten times, for the batch


def test_a_matrix_that_stays_indefinite_says_so():
    with pytest.raises(RuntimeError, match="not positive definite"):
        jittered_cholesky(-torch.eye(3, dtype=torch.float64)[None], 1e-6)
