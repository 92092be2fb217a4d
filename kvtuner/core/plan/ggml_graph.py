"""A shape-only model of ggml graphs and of ggml-alloc's graph allocator, for compute buffers.

llama.cpp sizes a backend's compute buffer by building the worst-case graph and letting
``ggml_gallocr`` (ggml/src/ggml-alloc.c) place every intermediate tensor in one virtual buffer; the
buffer is the highest offset it ever touched. The placement is deterministic and depends only on
the node list, each tensor's shape, type and strides, which tensors are views of which, and which
are graph inputs or outputs. This module reproduces those pieces without data:

- :class:`Tensor` and the graph-building helpers mirror the ggml calls llama.cpp makes (ggml.c
  ``ggml_new_tensor_impl``, ``ggml_view_*``, ``ggml_reshape_*``, ``ggml_permute``): a view's
  ``view_src`` is always the root tensor, strides follow ggml's ``nb`` rules;
- :class:`Graph` builds the node and leaf lists like ``ggml_build_forward_expand``: a depth-first
  walk of sources in order (``src[0]`` first), each tensor listed once, after its sources;
  tensors with op ``NONE`` (weights, inputs, caches) become leafs;
- :func:`allocate` is ``ggml_gallocr_alloc_graph_impl`` with ``ggml_dyn_tallocr`` for a single
  chunk (CPU buffer types have no maximum size): inputs first, then nodes in order; a node may
  take over its parent's memory when its op can run in place (``ggml_op_can_inplace``), the parent
  has no other consumer and the layouts are equal (``ggml_are_same_layout``); a tensor is freed
  when its last consumer and last view are done; free blocks are kept sorted and merged, and a new
  tensor takes the best-fitting (smallest sufficient) free block, the last block (the buffer's
  end) only when none fits.

All sizes are bytes; shapes are ggml's ``ne`` (innermost first).
"""

from __future__ import annotations

#: ops that ``ggml_op_can_inplace`` (ggml-alloc.c) lets reuse a parent's memory
INPLACE_OPS = frozenset(
    {
        "FILL",
        "SCALE",
        "DIAG_MASK_ZERO",
        "DIAG_MASK_INF",
        "ADD",
        "ADD_ID",
        "ADD1",
        "SUB",
        "MUL",
        "DIV",
        "SQR",
        "SQRT",
        "LOG",
        "UNARY",
        "ROPE",
        "ROPE_BACK",
        "SILU_BACK",
        "RMS_NORM",
        "RMS_NORM_BACK",
        "CLAMP",
        "SOFT_MAX",
        "SOFT_MAX_BACK",
    }
)

#: bytes per element of the activation types the graphs use
ELEMENT_BYTES = {"f32": 4, "f16": 2, "i32": 4, "i64": 8}

#: ggml-cpu's buffer alignment (ggml.h ``TENSOR_ALIGNMENT`` 32, the CPU buffer type's alignment)
CPU_ALIGNMENT = 32


class Tensor:
    """One ggml tensor: ``ne`` elements per dimension, ``nb`` byte strides, ``etype`` a key of
    :data:`ELEMENT_BYTES`; ``view_src`` the root tensor whose memory a view shares; ``nbytes``
    is ``ggml_nbytes`` (the span of the strided data). The last five slots are the allocator's
    state (:func:`allocate`)."""

    __slots__ = (
        "addr",
        "allocated",
        "etype",
        "external",
        "is_input",
        "is_output",
        "n_children",
        "n_views",
        "name",
        "nb",
        "nbytes",
        "ne",
        "op",
        "placed",
        "src",
        "view_offs",
        "view_src",
        "visited",
    )

    def __init__(
        self,
        name: str,
        op: str,
        ne: tuple[int, int, int, int],
        etype: str,
        src: tuple[Tensor, ...] = (),
        nb: tuple[int, int, int, int] | None = None,
        view_src: Tensor | None = None,
        view_offs: int = 0,
        *,
        is_input: bool = False,
        external: bool = False,
    ) -> None:
        self.name, self.op, self.ne, self.etype, self.src = name, op, ne, etype, src
        if nb is None:
            nb = contiguous_nb(ne, etype)
        self.nb = nb
        self.view_src, self.view_offs = view_src, view_offs
        self.is_input, self.is_output, self.external = is_input, False, external
        if ne[0] and ne[1] and ne[2] and ne[3]:
            self.nbytes = (
                ELEMENT_BYTES[etype]
                + (ne[0] - 1) * nb[0]
                + (ne[1] - 1) * nb[1]
                + (ne[2] - 1) * nb[2]
                + (ne[3] - 1) * nb[3]
            )
        else:
            self.nbytes = 0
        self.n_children = self.n_views = self.addr = 0
        self.allocated = self.placed = self.visited = False

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op}, ne={self.ne}, {self.etype})"

    def resize(self, n: int, dim: int = 0) -> None:
        """Give this contiguous tensor ``n`` elements in dimension ``dim`` (a graph reused for
        another KV size, :attr:`Graph.kv_sized`)."""
        ne = _ne4(tuple(n if i == dim else x for i, x in enumerate(self.ne)))
        self.ne = ne
        self.nb = nb = contiguous_nb(ne, self.etype)
        self.nbytes = (
            ELEMENT_BYTES[self.etype]
            + (ne[0] - 1) * nb[0]
            + (ne[1] - 1) * nb[1]
            + (ne[2] - 1) * nb[2]
            + (ne[3] - 1) * nb[3]
        )


def contiguous_nb(ne: tuple[int, ...], etype: str) -> tuple[int, int, int, int]:
    """Byte strides of a contiguous tensor (ggml.c ``ggml_new_tensor_impl``)."""
    es = ELEMENT_BYTES[etype]
    nb0 = es
    nb1 = nb0 * ne[0]
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


def _ne4(ne: tuple[int, ...]) -> tuple[int, int, int, int]:
    out = tuple(ne) + (1,) * (4 - len(ne))
    return out  # type: ignore[return-value]


class Graph:
    """Tensors created by a builder and the node/leaf order of ``ggml_build_forward_expand``."""

    def __init__(self) -> None:
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        #: contiguous tensors with a dimension of a KV cache's cell count, and which cache (``True``:
        #: the sliding-window one): the KQ masks, the scores without flash attention, f16 copies of
        #: an f32 cache for flash attention
        #: (the dimension is the third item)
        self.kv_sized: list[tuple[Tensor, bool, int]] = []

    # ---- creation helpers (ggml.c) ----
    def leaf(
        self, name: str, ne: tuple[int, ...], etype: str = "f32", *, external: bool = True, is_input: bool = False
    ) -> Tensor:
        """A weight or cache (external) or a graph input (``ggml_set_input``)."""
        return Tensor(name, "NONE", _ne4(ne), etype, external=external, is_input=is_input)

    def input(self, name: str, ne: tuple[int, ...], etype: str = "f32") -> Tensor:
        """A graph input the allocator places first (``ggml_set_input``)."""
        return self.leaf(name, ne, etype, external=False, is_input=True)

    def op(self, op: str, name: str, ne: tuple[int, ...], *src: Tensor | None, etype: str = "f32") -> Tensor:
        """A new contiguous result tensor of ``op`` over ``src``; ``None`` sources stand for weights,
        which live in another buffer and so never change the allocation (left out for speed)."""
        return Tensor(name, op, _ne4(ne), etype, tuple(t for t in src if t is not None))

    def view(
        self,
        a: Tensor,
        ne: tuple[int, ...],
        nb: tuple[int, ...] | None = None,
        offs: int = 0,
        op: str = "VIEW",
        name: str = "",
    ) -> Tensor:
        """``ggml_view_Nd`` / ``ggml_reshape_Nd`` (``nb`` None: contiguous)."""
        ne4 = _ne4(ne)
        if nb is None:
            nb4 = contiguous_nb(ne4, a.etype)
        else:
            # ggml_view_impl: missing higher strides follow the last given one
            full = [ELEMENT_BYTES[a.etype], *nb] + [0] * (3 - len(nb))
            for i in range(len(nb) + 1, 4):
                full[i] = full[i - 1] * ne4[i - 1]
            nb4 = (full[0], full[1], full[2], full[3])
        root = a.view_src or a
        return Tensor(name or a.name + " (view)", op, ne4, a.etype, (a,), nb4, root, a.view_offs + offs)

    def reshape(self, a: Tensor, *ne: int) -> Tensor:
        """``ggml_reshape_Nd`` of a contiguous tensor."""
        return self.view(a, ne, None, 0, "RESHAPE", a.name + " (reshaped)")

    def permute(self, a: Tensor, *axes: int) -> Tensor:
        """``ggml_permute``: dimension i of ``a`` goes to position ``axes[i]``."""
        ne = [0] * 4
        nb = [0] * 4
        ax = list(axes) + list(range(len(axes), 4))
        for i in range(4):
            ne[ax[i]] = a.ne[i]
            nb[ax[i]] = a.nb[i]
        root = a.view_src or a
        return Tensor(
            a.name + " (permuted)",
            "PERMUTE",
            (ne[0], ne[1], ne[2], ne[3]),
            a.etype,
            (a,),
            (nb[0], nb[1], nb[2], nb[3]),
            root,
            a.view_offs,
        )

    def transpose(self, a: Tensor) -> Tensor:
        """``ggml_transpose``."""
        return self.permute(a, 1, 0, 2, 3)

    def cast_f16(self, a: Tensor) -> Tensor:
        """``ggml_cast(a, GGML_TYPE_F16)``: a new contiguous f16 tensor, op CPY, sources ``a`` and itself."""
        t = Tensor(a.name + " (f16)", "CPY", a.ne, "f16", (a,))
        t.src = (a, t)
        return t

    def view_of_op(self, op: str, name: str, target: Tensor, *src: Tensor) -> Tensor:
        """An op whose result is a view of ``target`` (``ggml_set_rows``, ``ggml_cpy``)."""
        root = target.view_src or target
        return Tensor(name, op, target.ne, target.etype, (*src, target), target.nb, root, target.view_offs)

    # ---- ggml_build_forward_expand ----
    def expand(self, t: Tensor) -> None:
        """Append ``t`` and its not yet listed ancestors, sources first (ggml.c ``ggml_visit_parents``)."""
        if t.visited:
            return
        t.visited = True
        stack: list[tuple[Tensor, int]] = [(t, 0)]
        nodes, leafs = self.nodes, self.leafs
        while stack:
            node, i = stack[-1]
            srcs = node.src
            n = len(srcs)
            while i < n and srcs[i].visited:
                i += 1
            if i < n:
                stack[-1] = (node, i + 1)
                child = srcs[i]
                child.visited = True
                stack.append((child, 0))
                continue
            stack.pop()
            if node.op == "NONE":
                leafs.append(node)
            else:
                nodes.append(node)


class _Allocator:
    """``ggml_dyn_tallocr`` with one chunk: free blocks sorted by offset, the last one unbounded."""

    def __init__(self, alignment: int) -> None:
        self.alignment = alignment
        self.blocks: list[list[int]] = [[0, 1 << 62]]
        self.max_size = 0

    def _align(self, size: int) -> int:
        a = self.alignment
        return (size + a - 1) // a * a

    def alloc(self, size: int) -> int:
        size = self._align(size)
        best, best_size = -1, None
        blocks = self.blocks
        for i in range(len(blocks) - 1):
            bs = blocks[i][1]
            if bs >= size and (best_size is None or bs <= best_size):
                best, best_size = i, bs
        if best < 0:
            best = len(blocks) - 1
        b = blocks[best]
        offset = b[0]
        b[0] += size
        b[1] -= size
        if b[1] == 0:
            del blocks[best]
        if offset + size > self.max_size:
            self.max_size = offset + size
        return offset

    def free(self, offset: int, size: int) -> None:
        size = self._align(size)
        blocks = self.blocks
        for i, b in enumerate(blocks):
            if b[0] + b[1] == offset:
                b[1] += size
                if i < len(blocks) - 1 and b[0] + b[1] == blocks[i + 1][0]:
                    b[1] += blocks[i + 1][1]
                    del blocks[i + 1]
                return
            if offset + size == b[0]:
                b[0] = offset
                b[1] += size
                if i > 0 and blocks[i - 1][0] + blocks[i - 1][1] == b[0]:
                    blocks[i - 1][1] += b[1]
                    del blocks[i]
                return
        pos = 0
        while pos < len(blocks) and blocks[pos][0] < offset:
            pos += 1
        blocks.insert(pos, [offset, size])


def _same_layout(a: Tensor, b: Tensor) -> bool:
    return a.etype == b.etype and a.ne == b.ne and a.nb == b.nb


def allocate(graph: Graph, alignment: int = CPU_ALIGNMENT) -> int:
    """Peak bytes ``ggml_gallocr`` reserves for ``graph`` on one buffer (ggml-alloc.c
    ``ggml_gallocr_alloc_graph_impl``, ``ggml_gallocr_allocate_node``, ``ggml_gallocr_free_node``).

    The allocator state lives on the tensors and is reset first, so a graph can be allocated
    again after :meth:`Tensor.resize`."""
    alloc = _Allocator(alignment)
    align = alloc._align
    for t in graph.leafs:
        t.n_children = t.n_views = t.addr = 0
        t.allocated = t.placed = False
    for t in graph.nodes:
        t.n_children = t.n_views = t.addr = 0
        t.allocated = t.placed = False

    def allocate_node(t: Tensor) -> None:
        if t.external or t.allocated or t.placed or t.view_src is not None:
            return
        t.allocated = t.placed = True
        if t.op in INPLACE_OPS:
            for p in t.src:
                if not p.allocated:
                    continue
                if p.is_output or (p.view_src is not None and p.view_src.is_output):
                    continue
                if not (t.etype == p.etype and t.ne == p.ne and t.nb == p.nb):
                    continue
                if p.n_children == 1 and p.n_views == 0:
                    vs = p.view_src
                    if vs is not None:
                        if vs.n_views == 1 and vs.n_children == 0 and p.view_offs == 0:
                            t.addr = vs.addr
                            p.allocated = False
                            vs.allocated = False
                            extra = align(vs.nbytes) - align(t.nbytes)
                            if extra > 0:
                                alloc.free(t.addr + align(t.nbytes), extra)
                            return
                    else:
                        t.addr = p.addr
                        p.allocated = False
                        return
        t.addr = alloc.alloc(t.nbytes)

    def free_node(t: Tensor) -> None:
        if t.is_output:
            return
        alloc.free(t.addr, t.nbytes)
        t.allocated = False

    for leaf in graph.leafs:
        allocate_node(leaf)
    for node in graph.nodes:
        if node.view_src is not None and node.op != "NONE":
            node.view_src.n_views += 1
        if node.is_input:
            allocate_node(node)
        for s in node.src:
            s.n_children += 1
            if s.is_input:
                allocate_node(s)
    for node in graph.nodes:
        for p in node.src:
            if not (p.external or p.placed or p.view_src is not None):
                allocate_node(p)
        if not (node.placed or node.view_src is not None):
            allocate_node(node)
        for p in node.src:
            p.n_children -= 1
            if p.n_children == 0 and p.n_views == 0:
                vs = p.view_src
                if vs is not None:
                    vs.n_views -= 1
                    if vs.n_views == 0 and vs.n_children == 0 and vs.allocated:
                        free_node(vs)
                elif p.allocated:
                    free_node(p)
    return alloc.max_size
