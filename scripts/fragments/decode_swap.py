# Checks the fragment arithmetic of the decode attention with keys as the
# mma's rows (kernels/flash.cu, attn_decode_mma, branch wip/decode-swap) on
# the host: one warp's ldmatrix / mma.m16n8k16 / movmatrix.trans steps
# emulated with the PTX ISA's fragment layouts, the kernel's index
# expressions transcribed, against numpy attention (head dims 64 and 128,
# 1 to 16 heads a kv head, masked keys, tiles rescaled). It checks the
# indexing, not the hardware: TestAttention on a GPU does that.
#
#   python3 scripts/fragments/decode_swap.py   (numpy)
import numpy as np
rng = np.random.default_rng(0)
L = range(32)
gid = lambda l: l >> 2
tig = lambda l: l & 3

def ldm_x4(mat_rows, trans):
    # mat_rows[l] = the 8 elements at lane l's address; returns regs[i][l] = pair
    regs = [[None]*32 for _ in range(4)]
    for i in range(4):
        M = np.array([mat_rows[8*i + r] for r in range(8)])  # 8x8
        for l in L:
            if trans:
                regs[i][l] = (M[2*tig(l)][gid(l)], M[2*tig(l)+1][gid(l)])
            else:
                regs[i][l] = (M[gid(l)][2*tig(l)], M[gid(l)][2*tig(l)+1])
    return regs

def mma(c, a, b):
    # c[l] = [c0..c3]; a[j][l] pairs (j=0..3); b[j][l] pairs (j=0..1)
    A = np.zeros((16, 16)); B = np.zeros((16, 8)); C = np.zeros((16, 8))
    for l in L:
        g, t = gid(l), tig(l)
        for e in range(2):
            A[g][2*t+e] = a[0][l][e]; A[g+8][2*t+e] = a[1][l][e]
            A[g][2*t+8+e] = a[2][l][e]; A[g+8][2*t+8+e] = a[3][l][e]
            B[2*t+e][g] = b[0][l][e]; B[2*t+8+e][g] = b[1][l][e]
            C[g][2*t+e] = c[l][e]; C[g+8][2*t+e] = c[l][2+e]
    D = A @ B + C
    return [[D[gid(l)][2*tig(l)], D[gid(l)][2*tig(l)+1], D[gid(l)+8][2*tig(l)], D[gid(l)+8][2*tig(l)+1]] for l in L]

def movm(x):
    # x[l] = pair (row gid, cols 2tig, 2tig+1) of M; returns M^T in the same layout
    M = np.zeros((8, 8))
    for l in L:
        M[gid(l)][2*tig(l)] = x[l][0]; M[gid(l)][2*tig(l)+1] = x[l][1]
    return [(M[2*tig(l)][gid(l)], M[2*tig(l)+1][gid(l)]) for l in L]

def shfl_xor(v, m):
    return [v[l ^ m] for l in L]

def run(HD, G, ntiles, k1off):
    NG = (G + 7) // 8; KS = HD // 16
    Q = rng.standard_normal((G, HD)); qs = 0.3
    nkeys = 16 * ntiles
    K = rng.standard_normal((nkeys, HD)); V = rng.standard_normal((nkeys, HD))
    k1 = nkeys - k1off  # keys at and past k1 are masked
    mi = lambda l: l >> 3; mr = lambda l: l & 7
    qb = [[[None, None] for _ in range(NG)] for _ in range(KS)]
    for k in range(KS):
        for ng in range(NG):
            r0, r1 = [], []
            for l in L:
                g = ng*8 + gid(l); d = k*16 + 2*tig(l)
                r0.append((Q[g][d]*qs, Q[g][d+1]*qs) if g < G else (0., 0.))
                r1.append((Q[g][d+8]*qs, Q[g][d+9]*qs) if g < G else (0., 0.))
            qb[k][ng] = [r0, r1]
    o = [[[[0.]*4 for _ in L] for _ in range(NG)] for _ in range(KS)]
    mx = [[[-np.inf]*32, [-np.inf]*32] for _ in range(NG)]
    ls = [[[0.]*32, [0.]*32] for _ in range(NG)]
    for tile in range(ntiles):
        kw = tile * 16
        sK = K[kw:kw+16]; sV = V[kw:kw+16]
        sc = [[[0.]*4 for _ in L] for _ in range(NG)]; s2 = [[[0.]*4 for _ in L] for _ in range(NG)]
        for k in range(KS):
            a = ldm_x4([sK[(mi(l) & 1)*8 + mr(l)][k*16 + (mi(l) >> 1)*8: k*16 + (mi(l) >> 1)*8 + 8] for l in L], False)
            for ng in range(NG):
                if k & 1: s2[ng] = mma(s2[ng], a, qb[k][ng])
                else: sc[ng] = mma(sc[ng], a, qb[k][ng])
        pb = [None]*NG; cf = [[None]*32 for _ in range(NG)]
        cfs = [[[0.]*32, [0.]*32] for _ in range(NG)]
        P = [None]*NG
        for ng in range(NG):
            for l in L:
                for e in range(4): sc[ng][l][e] += s2[ng][l][e]
                if not (kw + gid(l) < k1): sc[ng][l][0] = sc[ng][l][1] = -np.inf
                if not (kw + gid(l) + 8 < k1): sc[ng][l][2] = sc[ng][l][3] = -np.inf
            for h in range(2):
                v = [max(sc[ng][l][h], sc[ng][l][h+2]) for l in L]
                for m in (4, 8, 16):
                    w = shfl_xor(v, m); v = [max(v[l], w[l]) for l in L]
                for l in L:
                    mn = max(mx[ng][h][l], v[l])
                    cfs[ng][h][l] = 2.0 ** (mx[ng][h][l] - mn) if mx[ng][h][l] != -np.inf else 0.
                    mx[ng][h][l] = mn
            p = [[2.0 ** (sc[ng][l][0] - mx[ng][0][l]), 2.0 ** (sc[ng][l][1] - mx[ng][1][l]),
                  2.0 ** (sc[ng][l][2] - mx[ng][0][l]), 2.0 ** (sc[ng][l][3] - mx[ng][1][l])] for l in L]
            for l in L:
                ls[ng][0][l] = ls[ng][0][l] * cfs[ng][0][l] + p[l][0] + p[l][2]
                ls[ng][1][l] = ls[ng][1][l] * cfs[ng][1][l] + p[l][1] + p[l][3]
            pb[ng] = [movm([(p[l][0], p[l][1]) for l in L]), movm([(p[l][2], p[l][3]) for l in L])]
        for m in range(KS):
            for ng in range(NG):
                for l in L:
                    o[m][ng][l][0] *= cfs[ng][0][l]; o[m][ng][l][1] *= cfs[ng][1][l]
                    o[m][ng][l][2] *= cfs[ng][0][l]; o[m][ng][l][3] *= cfs[ng][1][l]
        for m in range(KS):
            a = ldm_x4([sV[(mi(l) >> 1)*8 + mr(l)][m*16 + (mi(l) & 1)*8: m*16 + (mi(l) & 1)*8 + 8] for l in L], True)
            for ng in range(NG):
                o[m][ng] = mma(o[m][ng], a, pb[ng])
    out = np.full((G, HD), np.nan); lout = np.full(G, np.nan); mout = np.full(G, np.nan)
    for ng in range(NG):
        for h in range(2):
            v = ls[ng][h][:]
            for m_ in (4, 8, 16):
                w = shfl_xor(v, m_); v = [v[l] + w[l] for l in L]
            for l in L:
                g = ng*8 + 2*tig(l) + h
                if g < G:
                    for m in range(KS):
                        out[g][m*16 + gid(l)] = o[m][ng][l][h]
                        out[g][m*16 + gid(l) + 8] = o[m][ng][l][h+2]
                    if gid(l) == 0: mout[g] = mx[ng][h][l]; lout[g] = v[l]
    # reference
    S = (Q * qs) @ K[:k1].T  # log2 units as the kernel takes them
    M = S.max(axis=1); Pr = 2.0 ** (S - M[:, None])
    ref = Pr @ V[:k1]; lref = Pr.sum(axis=1)
    err = np.abs(out - ref).max() / np.abs(ref).max()
    print(f"HD {HD} G {G} tiles {ntiles} masked {k1off}: out {err:.2e} l {np.abs(lout-lref).max():.2e} m {np.abs(mout-M).max():.2e}")
    assert err < 1e-9 and np.abs(mout - M).max() < 1e-12

for HD, G, nt, mk in [(128, 4, 1, 0), (128, 4, 3, 5), (64, 5, 2, 9), (64, 16, 2, 0), (128, 10, 2, 13), (128, 1, 1, 0), (64, 8, 3, 15)]:
    run(HD, G, nt, mk)
