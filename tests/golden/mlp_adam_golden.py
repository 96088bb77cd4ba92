#!/usr/bin/env python3
"""Independent float64 reference for tests/training_test.cpp (Golden.TwoLayerMlpFiveAdamSteps).

A two-layer MLP, y = relu(x @ W1 + b1) @ W2 + b2, trained with Adam (PyTorch's update rule, no
weight decay) on the MSE over a fixed batch. Written with plain Python lists and floats, sharing
no code with the project, so it checks the project's lowering, autodiff, kernels and optimizer
end to end. Run it to regenerate the constants pasted in the test:  python3 mlp_adam_golden.py
"""
import math

# Exactly representable in float32, since datasets are stored in float32.
X = [[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-2.0, 1.0, 0.75], [0.125, 0.25, 0.375]]
Y = [[1.0, -1.0], [0.5, 0.25], [-0.75, 2.0], [0.0, 0.5]]
W1 = [[0.2, -0.1, 0.4, 0.3], [-0.5, 0.25, 0.1, -0.2], [0.3, 0.6, -0.4, 0.15]]
B1 = [0.05, -0.02, 0.1, 0.0]
W2 = [[0.3, -0.6], [0.5, 0.2], [-0.25, 0.4], [0.1, 0.7]]
B2 = [0.01, -0.03]
LR, BETA1, BETA2, EPS, STEPS = 0.01, 0.9, 0.999, 1e-8, 5


def forward_backward(w1, b1, w2, b2):
    n, h_dim, o_dim = len(X), len(b1), len(b2)
    pre = [[sum(X[i][k] * w1[k][j] for k in range(len(X[i]))) + b1[j] for j in range(h_dim)] for i in range(n)]
    hid = [[max(v, 0.0) for v in row] for row in pre]
    out = [[sum(hid[i][j] * w2[j][o] for j in range(h_dim)) + b2[o] for o in range(o_dim)] for i in range(n)]
    count = n * o_dim
    loss = sum((out[i][o] - Y[i][o]) ** 2 for i in range(n) for o in range(o_dim)) / count
    d_out = [[2.0 * (out[i][o] - Y[i][o]) / count for o in range(o_dim)] for i in range(n)]
    g_w2 = [[sum(hid[i][j] * d_out[i][o] for i in range(n)) for o in range(o_dim)] for j in range(h_dim)]
    g_b2 = [sum(d_out[i][o] for i in range(n)) for o in range(o_dim)]
    d_hid = [[sum(d_out[i][o] * w2[j][o] for o in range(o_dim)) for j in range(h_dim)] for i in range(n)]
    d_pre = [[d_hid[i][j] if pre[i][j] > 0 else 0.0 for j in range(h_dim)] for i in range(n)]
    g_w1 = [[sum(X[i][k] * d_pre[i][j] for i in range(n)) for j in range(h_dim)] for k in range(len(X[0]))]
    g_b1 = [sum(d_pre[i][j] for i in range(n)) for j in range(h_dim)]
    return loss, [g_w1, g_b1, g_w2, g_b2]


def flat(t):
    return [v for row in t for v in row] if isinstance(t[0], list) else list(t)


def unflat(v, like):
    if isinstance(like[0], list):
        cols = len(like[0])
        return [v[r * cols:(r + 1) * cols] for r in range(len(like))]
    return list(v)


def main():
    params = [W1, B1, W2, B2]
    m = [[0.0] * len(flat(p)) for p in params]
    v = [[0.0] * len(flat(p)) for p in params]
    for step in range(1, STEPS + 1):
        loss, grads = forward_backward(*params)
        print(f"step {step}: loss {loss!r}")
        new = []
        for i, (p, g) in enumerate(zip(params, grads)):
            pf, gf = flat(p), flat(g)
            for j in range(len(pf)):
                m[i][j] = BETA1 * m[i][j] + (1 - BETA1) * gf[j]
                v[i][j] = BETA2 * v[i][j] + (1 - BETA2) * gf[j] * gf[j]
                m_hat = m[i][j] / (1 - BETA1 ** step)
                v_hat = v[i][j] / (1 - BETA2 ** step)
                pf[j] -= LR * m_hat / (math.sqrt(v_hat) + EPS)
            new.append(unflat(pf, p))
        params = new
    print("final b2:", params[3])


if __name__ == "__main__":
    main()
