"""The expert layer as fused TT-Lang operations (docs/TT_BACKEND.md).

Every operation takes 2-D TILE tensors (sizes in multiples of 32) and runs on a grid of nodes; the node with
linear id i = row * cols + col takes the work units i, i + nodes, ... so any grid covers any size. Each factory
builds one operation for fixed sizes (the sizes of a layer never change, so one build serves every layer and step).

Constants enter as tiles of a small DRAM tensor `c` (every element of tile j equal to constant j), because
TT-Lang blocks combine with blocks only.

A TT-Lang operation declares its dataflow buffers and its three kernels (compute, read, write) inside its own
body, so each factory below is one operation and runs past the usual function length; the shared steps of the
compute kernels are helpers (_zero, _row_scale, _online_softmax_step).

The compute kernels follow the dataflow protocol the simulator enforces: a block taken with wait() must feed a
store() before it is released, so running values (sums of squares, accumulators, the softmax's max, sum and
output) go round through their own dataflow buffers rather than living in Python variables across blocks.
"""
from __future__ import annotations

import contextlib

TILE = 32
# Tiles of the constants tensor (constants()).
C_INV_D, C_EPS, C_INV_HEAD, C_SCALE = range(4)
N_CONSTS = 4
# The running maximum's start: below any score, finite so that exp(m_old - m_new) never sees inf - inf.
NEG_INIT = -1.0e30


# Row tiles of the constants tensor: float32 buffers of per-row values (the norms' sums of squares) take their
# shape from it, so it bounds the row tiles of a linear's work unit.
CONST_ROWS = 8


def constants(D: int, eps: float, d: int):
    """The constants tensor [32 * CONST_ROWS, 32 * N_CONSTS] (float32): 1/D, eps, 1/d, 1/sqrt(d), one tile column
    each, the same in every row tile."""
    import torch
    c = torch.zeros(TILE * CONST_ROWS, TILE * N_CONSTS)
    for j, v in ((C_INV_D, 1.0 / D), (C_EPS, eps), (C_INV_HEAD, 1.0 / d), (C_SCALE, d ** -0.5)):
        c[:, j * TILE:(j + 1) * TILE] = v
    return c


def _nid(ttl) -> tuple[int, int]:
    col, row = ttl.node(dims=2)
    cols, rows = ttl.grid_size(dims=2)
    return row * cols + col, cols * rows


def _zero(ttl, dfb, shape) -> None:
    with dfb.reserve() as blk:
        blk.store(ttl.block.fill(0, shape=shape))


def _row_scale(ttl, x_dfb, ci_dfb, ce_dfb, ss_dfb, sc_dfb, k_blocks: int, nb: int, mb: int = 1) -> None:
    """First pass of a fused RMSNorm: rsqrt(mean(x^2) + eps) of mb row tiles, broadcast to (mb, nb) into sc_dfb."""
    _zero(ttl, ss_dfb, (mb, 1))
    for _k in range(k_blocks):
        with x_dfb.wait() as xb, ss_dfb.wait() as prev, ss_dfb.reserve() as ss:
            ss.store(prev + ttl.math.reduce_sum(xb * xb, dims=[1], shape=(mb, 1)))
    with ss_dfb.wait() as ss, ci_dfb.wait() as inv_d, ce_dfb.wait() as eps, sc_dfb.reserve() as sc:
        inv_d, eps = (ttl.block.broadcast(t, dims=[0], shape=(mb, 1)) for t in (inv_d, eps))
        sc.store(ttl.block.broadcast(ttl.math.rsqrt(ss * inv_d + eps), dims=[1], shape=(mb, nb)))


def make_linear(ttl, grid, Mt: int, Kt: int, Nt: int, kb: int, nb: int, *, norm: bool, gated: bool,
                residual: bool, mb: int | None = None):
    """y = [RMSNorm(x) with gain g] @ w, or silu(n @ w) * (n @ w2) (gated), [+ res]: x [M, K], w/w2 [K, N].

    RMSNorm is fused: the row scale r = rsqrt(mean(x^2) + eps) commutes with the matmul, so a node computes
    r from a first pass over its rows, then ((x * g) @ w) * r, never writing the normed x. Work unit: a block of
    mb row tiles (default all Mt, at most CONST_ROWS) x one block of nb output tiles; the weight streams through
    in (kb, nb) blocks, so with mb = Mt every weight byte is read from DRAM once per operation, whatever the
    number of row tiles."""
    mb = Mt if mb is None else mb
    if mb > CONST_ROWS:
        raise ValueError(f"linear: {mb} row tiles per unit, more than the constants tensor's {CONST_ROWS}")
    if norm == residual or gated and not norm:
        raise ValueError("linear: the layer fuses RMSNorm (optionally gated) or a residual, one of the two")
    if Kt % kb or Nt % nb or Mt % mb:
        raise ValueError(f"linear: M / K / N tiles {Mt} / {Kt} / {Nt} not multiples of the blocks {mb} / {kb} / {nb}")
    k_blocks, units = Kt // kb, [(m * mb, n) for m in range(Mt // mb) for n in range(Nt // nb)]

    @ttl.operation(grid=grid)
    def linear(x, w, w2, g, res, c, y):
        x_dfb = ttl.make_dataflow_buffer_like(x, shape=(mb, kb), block_count=2)
        g_dfb = ttl.make_dataflow_buffer_like(x, shape=(1, kb), block_count=2)  # like x: g may be a placeholder
        w_dfb = ttl.make_dataflow_buffer_like(w, shape=(kb, nb), block_count=2)
        w2_dfb = ttl.make_dataflow_buffer_like(w, shape=(kb, nb), block_count=2)
        ci_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        ce_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        r_dfb = ttl.make_dataflow_buffer_like(y, shape=(mb, nb), block_count=2)
        y_dfb = ttl.make_dataflow_buffer_like(y, shape=(mb, nb), block_count=2)
        ss_dfb = ttl.make_dataflow_buffer_like(c, shape=(mb, 1), block_count=2)    # sum of squares
        sc_dfb = ttl.make_dataflow_buffer_like(y, shape=(mb, nb), block_count=1)   # the row scale, broadcast
        acc_dfb = ttl.make_dataflow_buffer_like(y, shape=(mb, nb), block_count=2)
        acc2_dfb = ttl.make_dataflow_buffer_like(y, shape=(mb, nb), block_count=2)

        @ttl.compute()
        def compute():
            nid, nodes = _nid(ttl)
            for _ in units[nid::nodes]:
                if norm:
                    _row_scale(ttl, x_dfb, ci_dfb, ce_dfb, ss_dfb, sc_dfb, k_blocks, nb, mb)
                _zero(ttl, acc_dfb, (mb, nb))
                if gated:
                    _zero(ttl, acc2_dfb, (mb, nb))
                for _k in range(k_blocks):
                    with x_dfb.wait() as xb, w_dfb.wait() as wb, acc_dfb.wait() as prev:
                        if norm:
                            with g_dfb.wait() as gb, acc_dfb.reserve() as a:
                                xg = xb * ttl.block.broadcast(gb, dims=[0], shape=(mb, kb))
                                if gated:
                                    with w2_dfb.wait() as wb2, acc2_dfb.wait() as prev2, acc2_dfb.reserve() as a2:
                                        a.store(prev + xg @ wb)
                                        a2.store(prev2 + xg @ wb2)
                                else:
                                    a.store(prev + xg @ wb)
                        else:
                            with acc_dfb.reserve() as a:
                                a.store(prev + xb @ wb)
                with acc_dfb.wait() as a, y_dfb.reserve() as yb:
                    if norm:
                        with sc_dfb.wait() as sc:
                            if gated:
                                with acc2_dfb.wait() as a2:
                                    yb.store(ttl.math.silu(a * sc) * (a2 * sc))
                            else:
                                yb.store(a * sc)
                    elif residual:
                        with r_dfb.wait() as rb:
                            yb.store(a + rb)
                    else:
                        yb.store(a)

        @ttl.datamovement()
        def read():
            nid, nodes = _nid(ttl)
            for m, n in units[nid::nodes]:
                rows = slice(m, m + mb)
                if norm:
                    _read_norm_pass(ttl, c, x, rows, k_blocks, kb, ci_dfb, ce_dfb, x_dfb)
                for k in range(k_blocks):
                    ks = slice(k * kb, (k + 1) * kb)
                    with x_dfb.reserve() as xb, w_dfb.reserve() as wb:
                        tx = ttl.copy(x[rows, ks], xb)
                        tw = ttl.copy(w[ks, n * nb:(n + 1) * nb], wb)
                        tx.wait()
                        tw.wait()
                    if norm:
                        with g_dfb.reserve() as gb:
                            ttl.copy(g[0:1, ks], gb).wait()
                    if gated:
                        with w2_dfb.reserve() as wb2:
                            ttl.copy(w2[ks, n * nb:(n + 1) * nb], wb2).wait()
                if residual:
                    with r_dfb.reserve() as rb:
                        ttl.copy(res[rows, n * nb:(n + 1) * nb], rb).wait()

        @ttl.datamovement()
        def write():
            nid, nodes = _nid(ttl)
            for m, n in units[nid::nodes]:
                with y_dfb.wait() as yb:
                    ttl.copy(yb, y[m:m + mb, n * nb:(n + 1) * nb]).wait()

    return linear


def make_rmsnorm(ttl, grid, Mt: int, Dt: int):
    """y = RMSNorm(x) * g (the final norm): one row tile per work unit."""
    units = list(range(Mt))

    @ttl.operation(grid=grid)
    def rmsnorm(x, g, c, y):
        x_dfb = ttl.make_dataflow_buffer_like(x, shape=(1, Dt), block_count=2)
        g_dfb = ttl.make_dataflow_buffer_like(g, shape=(1, Dt), block_count=1)
        ci_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        ce_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        ss_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=2)
        sc_dfb = ttl.make_dataflow_buffer_like(y, shape=(1, Dt), block_count=1)
        y_dfb = ttl.make_dataflow_buffer_like(y, shape=(1, Dt), block_count=2)

        @ttl.compute()
        def compute():
            nid, nodes = _nid(ttl)
            for _ in units[nid::nodes]:
                _row_scale(ttl, x_dfb, ci_dfb, ce_dfb, ss_dfb, sc_dfb, 1, Dt)
                with x_dfb.wait() as xb, g_dfb.wait() as gb, sc_dfb.wait() as sc, y_dfb.reserve() as yb:
                    yb.store(xb * sc * gb)

        @ttl.datamovement()
        def read():
            nid, nodes = _nid(ttl)
            for m in units[nid::nodes]:
                _read_norm_inputs(ttl, c, C_INV_D, ci_dfb, ce_dfb)
                for _ in range(2):
                    with x_dfb.reserve() as xb:
                        ttl.copy(x[m:m + 1, 0:Dt], xb).wait()
                with g_dfb.reserve() as gb:
                    ttl.copy(g[0:1, 0:Dt], gb).wait()

        @ttl.datamovement()
        def write():
            nid, nodes = _nid(ttl)
            for m in units[nid::nodes]:
                with y_dfb.wait() as yb:
                    ttl.copy(yb, y[m:m + 1, 0:Dt]).wait()

    return rmsnorm


def _read_norm_inputs(ttl, c, inv_tile: int, ci_dfb, ce_dfb) -> None:
    with ci_dfb.reserve() as blk:
        ttl.copy(c[0:1, inv_tile:inv_tile + 1], blk).wait()
    with ce_dfb.reserve() as blk:
        ttl.copy(c[0:1, C_EPS:C_EPS + 1], blk).wait()


def _read_norm_pass(ttl, c, x, rows, k_blocks: int, kb: int, ci_dfb, ce_dfb, x_dfb) -> None:
    """The RMSNorm's first pass of a fused linear: its constants, then the row tile's x, block by block."""
    _read_norm_inputs(ttl, c, C_INV_D, ci_dfb, ce_dfb)
    for k in range(k_blocks):
        with x_dfb.reserve() as blk:
            ttl.copy(x[rows, k * kb:(k + 1) * kb], blk).wait()


def make_qkv_rope(ttl, grid, B: int, Tpt: int, Kt: int, kb: int, Hq: int, Hkv: int, dt: int, Smaxt: int):
    """RMSNorm + the qkv matmul + q/k RMSNorm + RoPE + head split in one operation (no qkv tensor, no
    nlp_create_qkv_heads): x [B*Tp, D], w = wqkv.T [D, (Hq + 2 Hkv) d].

    Work unit: one sample's Tpt row tiles x one head. A node computes the head's columns of the normed qkv
    matmul as make_linear does (h = ((x * g) @ w_head) * r), then, for a q or k head, the head's RMSNorm and
    RoPE on the (Tpt, dt) block it holds: n = h * rsqrt(mean(h^2) + eps) * g_head, y = n * cos + (n @ rot) * sin
    (rotate_half as a signed permutation matmul, exact in any precision). q heads go to q_packed
    [B*Hkv*G*Tp, d], GQA-packed (the G query heads of KV head kh consecutive row blocks); own k and v straight
    into the caches' scratch tail, rows [Smax - Tp, Smax) of each (b, kh) block of the cache [B*Hkv*Smax, d].
    A sample's row tiles land on consecutive rows of each destination, so the unit writes one block. Each weight
    column block is streamed once per sample (once per operation at B = 1)."""
    G, k_blocks = Hq // Hkv, Kt // kb
    if Kt % kb or Tpt > CONST_ROWS:
        raise ValueError(f"qkv_rope: K tiles {Kt} not a multiple of the block {kb}, or more than {CONST_ROWS} row "
                         f"tiles per sample ({Tpt})")
    units = [(b, h) for b in range(B) for h in range(Hq + 2 * Hkv)]

    def dest(b: int, h: int) -> tuple[int, int]:
        """(0 q / 1 k / 2 v, first row tile) of unit (b, h)."""
        if h < Hq:
            kh, j = divmod(h, G)
            return 0, ((b * Hkv + kh) * G + j) * Tpt
        kind, kh = (1, h - Hq) if h < Hq + Hkv else (2, h - Hq - Hkv)
        return kind, (b * Hkv + kh) * Smaxt + Smaxt - Tpt

    @ttl.operation(grid=grid)
    def qkv_rope(x, w, g, gq, gk, cos, sin, rot, c, q_packed, k_cache, v_cache):
        x_dfb = ttl.make_dataflow_buffer_like(x, shape=(Tpt, kb), block_count=2)
        g_dfb = ttl.make_dataflow_buffer_like(g, shape=(1, kb), block_count=2)
        w_dfb = ttl.make_dataflow_buffer_like(w, shape=(kb, dt), block_count=2)
        ci_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        ce_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        ss_dfb = ttl.make_dataflow_buffer_like(c, shape=(Tpt, 1), block_count=2)
        sc_dfb = ttl.make_dataflow_buffer_like(x, shape=(Tpt, dt), block_count=1)
        acc_dfb = ttl.make_dataflow_buffer_like(x, shape=(Tpt, dt), block_count=2)
        h_dfb = ttl.make_dataflow_buffer_like(x, shape=(Tpt, dt), block_count=1)
        gh_dfb = ttl.make_dataflow_buffer_like(gq, shape=(1, dt), block_count=1)
        cos_dfb = ttl.make_dataflow_buffer_like(cos, shape=(Tpt, dt), block_count=1)
        sin_dfb = ttl.make_dataflow_buffer_like(sin, shape=(Tpt, dt), block_count=1)
        rot_dfb = ttl.make_dataflow_buffer_like(rot, shape=(dt, dt), block_count=1)
        n_dfb = ttl.make_dataflow_buffer_like(x, shape=(Tpt, dt), block_count=1)
        y_dfb = ttl.make_dataflow_buffer_like(q_packed, shape=(Tpt, dt), block_count=2)

        @ttl.compute()
        def compute():
            nid, nodes = _nid(ttl)
            for b, h in units[nid::nodes]:
                _row_scale(ttl, x_dfb, ci_dfb, ce_dfb, ss_dfb, sc_dfb, k_blocks, dt, Tpt)
                _zero(ttl, acc_dfb, (Tpt, dt))
                for _k in range(k_blocks):
                    with x_dfb.wait() as xb, w_dfb.wait() as wb, g_dfb.wait() as gb, acc_dfb.wait() as prev:
                        with acc_dfb.reserve() as a:
                            a.store(prev + (xb * ttl.block.broadcast(gb, dims=[0], shape=(Tpt, kb))) @ wb)
                out = y_dfb if dest(b, h)[0] == 2 else h_dfb   # v: the head's values are the result
                with acc_dfb.wait() as a, sc_dfb.wait() as sc, out.reserve() as hb:
                    hb.store(a * sc)
                if out is y_dfb:
                    continue
                # The head's RMSNorm on the block in hand (one head is one block of columns).
                with h_dfb.wait() as hb, ci_dfb.wait() as inv_d, ce_dfb.wait() as eps, gh_dfb.wait() as gh:
                    with n_dfb.reserve() as nb_:
                        inv_d, eps = (ttl.block.broadcast(t, dims=[0], shape=(Tpt, 1)) for t in (inv_d, eps))
                        r = ttl.math.rsqrt(ttl.math.reduce_sum(hb * hb, dims=[1], shape=(Tpt, 1)) * inv_d + eps)
                        nb_.store(hb * ttl.block.broadcast(r, dims=[1], shape=(Tpt, dt))
                                  * ttl.block.broadcast(gh, dims=[0], shape=(Tpt, dt)))
                with n_dfb.wait() as nb_, rot_dfb.wait() as rb, cos_dfb.wait() as cb, sin_dfb.wait() as sb:
                    with y_dfb.reserve() as yb:
                        yb.store(nb_ * cb + (nb_ @ rb) * sb)

        @ttl.datamovement()
        def read():
            nid, nodes = _nid(ttl)
            for b, h in units[nid::nodes]:
                rows, cols = slice(b * Tpt, (b + 1) * Tpt), slice(h * dt, (h + 1) * dt)
                _read_norm_pass(ttl, c, x, rows, k_blocks, kb, ci_dfb, ce_dfb, x_dfb)
                for k in range(k_blocks):
                    ks = slice(k * kb, (k + 1) * kb)
                    with x_dfb.reserve() as xb, w_dfb.reserve() as wb, g_dfb.reserve() as gb:
                        tx = ttl.copy(x[rows, ks], xb)
                        tw = ttl.copy(w[ks, cols], wb)
                        tg = ttl.copy(g[0:1, ks], gb)
                        tx.wait()
                        tw.wait()
                        tg.wait()
                kind = dest(b, h)[0]
                if kind == 2:
                    continue
                _read_norm_inputs(ttl, c, C_INV_HEAD, ci_dfb, ce_dfb)
                with gh_dfb.reserve() as gb:
                    ttl.copy((gq if kind == 0 else gk)[0:1, 0:dt], gb).wait()
                with rot_dfb.reserve() as rb:
                    ttl.copy(rot[0:dt, 0:dt], rb).wait()
                with cos_dfb.reserve() as cb:
                    ttl.copy(cos[rows, 0:dt], cb).wait()
                with sin_dfb.reserve() as sb:
                    ttl.copy(sin[rows, 0:dt], sb).wait()

        @ttl.datamovement()
        def write():
            nid, nodes = _nid(ttl)
            for b, h in units[nid::nodes]:
                kind, row = dest(b, h)
                with y_dfb.wait() as yb:
                    ttl.copy(yb, (q_packed, k_cache, v_cache)[kind][row:row + Tpt, 0:dt]).wait()

    return qkv_rope


def attention_split(Smaxt: int, kc: int, nsplit: int) -> list[tuple[int, int]]:
    """The key chunks [c0, c1) of each of the nsplit partial attentions (the key sequence split across nodes)."""
    n_chunks = Smaxt // kc
    if not 1 <= nsplit <= n_chunks:
        raise ValueError(f"attention: {nsplit} splits of {n_chunks} key chunks (each split needs one)")
    return [(s * n_chunks // nsplit, (s + 1) * n_chunks // nsplit) for s in range(nsplit)]


def make_attention_partial(ttl, grid, B: int, Hkv: int, Rt: int, dt: int, Smaxt: int, kc: int, nsplit: int,
                           Tpt: int):
    """Flash attention of the GQA-packed queries of one (b, kh) over one range of key chunks of its cache block.

    Work unit: (b*Hkv + kh, split s). All Rt = G*Tp/32 query row tiles of the KV head go through together, so
    each key chunk is read from DRAM once per layer (the seed's decode kernel likewise viewed the G heads x Tp
    tokens as one user's 128 rows). The node keeps a running max m, sum l and output o per query row over its
    chunks (scores = q k^T * scale + mask, the mask additive per cache row) and writes them for attention_merge.

    Valid length at run time: the key range [0, Smax) is split over the nodes as for any S, and a node attends
    only its chunks that hold context rows (chunk < n_ctx, read from the device at run time) or the own
    tail (the chunks from Smax - Tp on); the mask hides the rest of a partly used chunk (left padding, rows
    from S on, the own padding). So the operation depends on (B, Smax) only and reads S rows, not Smax. A split
    with no chunk to attend writes m = NEG_INIT, l = 0, o = 0, which the merge weighs by exp(NEG_INIT - M) = 0.

    The mask is read and added only where it is not all zero: the chunks holding left padding (chunk < lead),
    the one holding S's boundary and the own tail (chunk >= full, the first chunk not wholly context). The
    three counts are tiles 0-2 of row tile b of kv_chunks (kv_chunk_counts)."""
    if Smaxt % kc:
        raise ValueError(f"attention: cache tiles {Smaxt} not a multiple of the key chunk {kc}")
    splits = attention_split(Smaxt, kc, nsplit)
    units = [(bk, s) for bk in range(B * Hkv) for s in range(nsplit)]
    tail0 = (Smaxt - Tpt) // kc  # the first chunk holding own-token rows

    def attended(c0: int, c1: int, n_ctx: int) -> list[int]:
        return [ch for ch in range(c0, c1) if ch < n_ctx or ch >= tail0]

    def masked(ch: int, lead: int, full: int) -> bool:
        return ch < lead or ch >= full

    @ttl.operation(grid=grid)
    def attention_partial(q_packed, k_cache, v_cache, mask, kv_chunks, c, o_part, m_part, l_part):
        q_dfb = ttl.make_dataflow_buffer_like(q_packed, shape=(Rt, dt), block_count=1)
        sc_dfb = ttl.make_dataflow_buffer_like(c, shape=(1, 1), block_count=1)
        k_dfb = ttl.make_dataflow_buffer_like(k_cache, shape=(kc, dt), block_count=2)
        v_dfb = ttl.make_dataflow_buffer_like(v_cache, shape=(kc, dt), block_count=2)
        mask_dfb = ttl.make_dataflow_buffer_like(mask, shape=(1, kc), block_count=2)
        s_dfb = ttl.make_dataflow_buffer_like(mask, shape=(Rt, kc), block_count=1)
        m_dfb = ttl.make_dataflow_buffer_like(m_part, shape=(Rt, 1), block_count=2)
        l_dfb = ttl.make_dataflow_buffer_like(l_part, shape=(Rt, 1), block_count=2)
        o_dfb = ttl.make_dataflow_buffer_like(o_part, shape=(Rt, dt), block_count=2)
        n_dfb = ttl.make_dataflow_buffer_like(kv_chunks, shape=(1, 3), block_count=1)
        mo_dfb = ttl.make_dataflow_buffer_like(m_part, shape=(Rt, 1), block_count=1)  # the results, to the writer
        lo_dfb = ttl.make_dataflow_buffer_like(l_part, shape=(Rt, 1), block_count=1)
        oo_dfb = ttl.make_dataflow_buffer_like(o_part, shape=(Rt, dt), block_count=1)

        @ttl.compute()
        def compute():
            nid, nodes = _nid(ttl)
            for _bk, s in units[nid::nodes]:
                c0, c1 = splits[s]
                # The counts reach the compute thread as tiles; a waited block must feed a store, so they seed
                # the running max: NEG_INIT + sum(counts - counts) is NEG_INIT exactly (the counts are finite).
                with n_dfb.wait() as nb_, m_dfb.reserve() as mb:
                    n_ctx, lead, full = (run_time_count(nb_, j) for j in range(3))
                    zero = ttl.math.reduce_sum(nb_ - nb_, dims=[1], shape=(1, 1))
                    mb.store(ttl.block.broadcast(ttl.block.fill(NEG_INIT, shape=(1, 1)) + zero, dims=[0],
                                                 shape=(Rt, 1)))
                _zero(ttl, l_dfb, (Rt, 1))
                _zero(ttl, o_dfb, (Rt, dt))
                chunks = attended(c0, c1, n_ctx)
                with q_dfb.wait() if chunks else contextlib.nullcontext() as qb, \
                        sc_dfb.wait() if chunks else contextlib.nullcontext() as scale:
                    for ch in chunks:
                        with k_dfb.wait() as kb_, s_dfb.reserve() as sb:
                            scores = qb @ ttl.block.transpose(kb_) * ttl.block.broadcast(scale, dims=[0, 1],
                                                                                         shape=(Rt, kc))
                            if masked(ch, lead, full):
                                with mask_dfb.wait() as mk:
                                    sb.store(scores + ttl.block.broadcast(mk, dims=[0], shape=(Rt, kc)))
                            else:
                                sb.store(scores)
                        _online_softmax_step(ttl, s_dfb, v_dfb, m_dfb, l_dfb, o_dfb, Rt, kc, dt)
                with m_dfb.wait() as mb, l_dfb.wait() as lb, o_dfb.wait() as ob:
                    with mo_dfb.reserve() as mo, lo_dfb.reserve() as lo, oo_dfb.reserve() as oo:
                        mo.store(mb)
                        lo.store(lb)
                        oo.store(ob)

        @ttl.datamovement()
        def read():
            nid, nodes = _nid(ttl)
            for bk, s in units[nid::nodes]:
                c0, c1 = splits[s]
                b = bk // Hkv
                with n_dfb.reserve() as nb_:
                    ttl.copy(kv_chunks[b:b + 1, 0:3], nb_).wait()
                    n_ctx, lead, full = (run_time_count(nb_, j) for j in range(3))
                chunks = attended(c0, c1, n_ctx)
                if chunks:  # a split past the valid length reads nothing
                    with q_dfb.reserve() as qb:
                        ttl.copy(q_packed[bk * Rt:(bk + 1) * Rt, 0:dt], qb).wait()
                    with sc_dfb.reserve() as blk:
                        ttl.copy(c[0:1, C_SCALE:C_SCALE + 1], blk).wait()
                for ch in chunks:
                    keys = slice(bk * Smaxt + ch * kc, bk * Smaxt + (ch + 1) * kc)
                    with k_dfb.reserve() as kb_:
                        ttl.copy(k_cache[keys, 0:dt], kb_).wait()
                    if masked(ch, lead, full):
                        with mask_dfb.reserve() as mk:
                            ttl.copy(mask[b:b + 1, ch * kc:(ch + 1) * kc], mk).wait()
                    with v_dfb.reserve() as vb:
                        ttl.copy(v_cache[keys, 0:dt], vb).wait()

        @ttl.datamovement()
        def write():
            nid, nodes = _nid(ttl)
            for bk, s in units[nid::nodes]:
                rows = slice((bk * nsplit + s) * Rt, (bk * nsplit + s + 1) * Rt)
                with oo_dfb.wait() as ob, mo_dfb.wait() as mb, lo_dfb.wait() as lb:
                    to = ttl.copy(ob, o_part[rows, 0:dt])
                    tm = ttl.copy(mb, m_part[rows, 0:1])
                    tl = ttl.copy(lb, l_part[rows, 0:1])
                    to.wait()
                    tm.wait()
                    tl.wait()

    return attention_partial


def kv_chunk_counts(S: list[int], pads: list[int], chunk_rows: int):
    """attention_partial's run-time counts, tiles 0-2 of row tile b (float32 [32 B, 96]): the chunks holding
    context rows, those holding left padding, and the chunks wholly context (from there on the mask is needed)."""
    import torch
    counts = torch.tensor([[-(-s // chunk_rows), -(-p // chunk_rows), s // chunk_rows] for s, p in zip(S, pads)],
                          dtype=torch.float32)
    return counts.repeat_interleave(TILE, 0).repeat_interleave(TILE, 1).contiguous()


def run_time_count(blk, tile: int = 0) -> int:
    """A loop bound read at run time: element (0, 0) of tile `tile` of a block that a node copied from the device.

    TT-Lang's documented block operations are whole-tile arithmetic; reading one value of L1 into a loop bound
    is what a tt-metal kernel does with a pointer, and the simulator backs a block with a torch tensor, which
    this reads. Whether the TT-Lang compiler accepts it is unknown here (docs/TT_BACKEND.md)."""
    t = blk.get_item(tile)
    t = t.to_torch() if hasattr(t, "to_torch") else t
    return int(round(float(t.reshape(-1)[0])))


def _online_softmax_step(ttl, s_dfb, v_dfb, m_dfb, l_dfb, o_dfb, Rt: int, kc: int, dt: int) -> None:
    """One key chunk into the running (m, l, o) of every query row: m' = max(m, max s), p = exp(s - m'),
    l' = l e^(m - m') + sum p, o' = o e^(m - m') + p v (row values in column 0 of m and l)."""
    with s_dfb.wait() as sb, v_dfb.wait() as vb, m_dfb.wait() as mp, l_dfb.wait() as lp, o_dfb.wait() as op_:
        m_new = ttl.math.max(mp, ttl.math.reduce_max(sb, dims=[1], shape=(Rt, 1)))
        p = ttl.math.exp(sb - ttl.block.broadcast(m_new, dims=[1], shape=(Rt, kc)))
        corr = ttl.math.exp(mp - m_new)
        with m_dfb.reserve() as mn, l_dfb.reserve() as ln, o_dfb.reserve() as on:
            mn.store(m_new)
            ln.store(lp * corr + ttl.math.reduce_sum(p, dims=[1], shape=(Rt, 1)))
            on.store(op_ * ttl.block.broadcast(corr, dims=[1], shape=(Rt, dt)) + p @ vb)


def make_attention_merge(ttl, grid, B: int, Hkv: int, G: int, Tpt: int, dt: int, nsplit: int, Smaxt: int,
                         kc: int):
    """The log-sum-exp merge of the partials of each query row tile, written in concatenated-head layout
    [B*Tp, Hq*d] (o_proj's input; no nlp_concat_heads): M = max m_s, O = sum o_s e^(m_s - M) / sum l_s e^(m_s - M).

    Work unit: one query row tile x one of the head's dt column tiles, so the merge spreads over B*Hkv*Rt*dt
    nodes rather than B*Hkv*Rt. Only the splits that attended a chunk enter it (read at run time from
    kv_chunks as attention_partial does); the others hold m = NEG_INIT and would add exactly zero. One pass over
    the splits with a running max (as the partials run over key chunks), so each split's m, l and o are read
    once: M' = max(M, m_s), L' = L e^(M - M') + l_s e^(m_s - M'), O' likewise. m and l hold a row's value in
    column 0 of their tile, so it is broadcast along the row (dims=[1]) before use."""
    Rt = G * Tpt
    splits = attention_split(Smaxt, kc, nsplit)
    tail0 = (Smaxt - Tpt) // kc
    units = [(bk, r, j) for bk in range(B * Hkv) for r in range(Rt) for j in range(dt)]

    def live(n_ctx: int) -> list[int]:
        """The splits holding a chunk below n_ctx or in the own tail (never none: the last split holds the tail)."""
        return [s for s, (c0, c1) in enumerate(splits) if c0 < n_ctx or c1 > tail0]

    @ttl.operation(grid=grid)
    def attention_merge(o_part, m_part, l_part, kv_chunks, out):
        o_dfb = ttl.make_dataflow_buffer_like(o_part, shape=(1, 1), block_count=2)
        m_dfb = ttl.make_dataflow_buffer_like(m_part, shape=(1, 1), block_count=2)
        l_dfb = ttl.make_dataflow_buffer_like(l_part, shape=(1, 1), block_count=2)
        n_dfb = ttl.make_dataflow_buffer_like(kv_chunks, shape=(1, 1), block_count=1)
        gm_dfb = ttl.make_dataflow_buffer_like(m_part, shape=(1, 1), block_count=2)
        L_dfb = ttl.make_dataflow_buffer_like(l_part, shape=(1, 1), block_count=2)
        O_dfb = ttl.make_dataflow_buffer_like(o_part, shape=(1, 1), block_count=2)
        y_dfb = ttl.make_dataflow_buffer_like(out, shape=(1, 1), block_count=2)

        @ttl.compute()
        def compute():
            nid, nodes = _nid(ttl)
            for _ in units[nid::nodes]:
                # The count seeds the running max (a waited block must feed a store): NEG_INIT + (n - n).
                with n_dfb.wait() as nb_, gm_dfb.reserve() as gb:
                    used = live(run_time_count(nb_))
                    gb.store(ttl.block.fill(NEG_INIT, shape=(1, 1)) + (nb_ - nb_))
                _zero(ttl, L_dfb, (1, 1))
                _zero(ttl, O_dfb, (1, 1))
                for _s in used:
                    with m_dfb.wait() as mi, l_dfb.wait() as li, o_dfb.wait() as oi, gm_dfb.wait() as mp:
                        with L_dfb.wait() as Lp, O_dfb.wait() as Op:
                            with gm_dfb.reserve() as mn, L_dfb.reserve() as Ln, O_dfb.reserve() as On:
                                m_new = ttl.math.max(mp, mi)
                                e_old, e_new = ttl.math.exp(mp - m_new), ttl.math.exp(mi - m_new)
                                mn.store(m_new)
                                Ln.store(Lp * e_old + li * e_new)
                                On.store(Op * ttl.block.broadcast(e_old, dims=[1], shape=(1, 1))
                                         + oi * ttl.block.broadcast(e_new, dims=[1], shape=(1, 1)))
                # The final max must feed a store too: + (M - M), exactly 0 (M is finite).
                with gm_dfb.wait() as gm, L_dfb.wait() as Lt, O_dfb.wait() as Ot, y_dfb.reserve() as yb:
                    yb.store(Ot * ttl.block.broadcast(ttl.math.recip(Lt), dims=[1], shape=(1, 1)) + (gm - gm))

        @ttl.datamovement()
        def read():
            nid, nodes = _nid(ttl)
            for bk, r, j in units[nid::nodes]:
                b = bk // Hkv
                with n_dfb.reserve() as nb_:
                    ttl.copy(kv_chunks[b:b + 1, 0:1], nb_).wait()
                    used = live(run_time_count(nb_))
                for s in used:
                    u = (bk * nsplit + s) * Rt + r
                    with m_dfb.reserve() as mb, l_dfb.reserve() as lb, o_dfb.reserve() as ob:
                        tm = ttl.copy(m_part[u:u + 1, 0:1], mb)
                        tl = ttl.copy(l_part[u:u + 1, 0:1], lb)
                        to = ttl.copy(o_part[u:u + 1, j:j + 1], ob)
                        tm.wait()
                        tl.wait()
                        to.wait()

        @ttl.datamovement()
        def write():
            nid, nodes = _nid(ttl)
            for bk, r, j in units[nid::nodes]:
                b, kh = divmod(bk, Hkv)
                jh, t = divmod(r, Tpt)
                col = (kh * G + jh) * dt + j
                with y_dfb.wait() as yb:
                    ttl.copy(yb, out[b * Tpt + t:b * Tpt + t + 1, col:col + 1]).wait()

    return attention_merge
