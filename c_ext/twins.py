"""The pure-Python twins of pm.c, line for line.

PEERMEM_BACKEND=python (or Machine(backend="python")) runs these instead of
the C loops; the tests run both on the same inputs and demand equal results.
`mem` is a c_ext.MemCtx: `ram_q` is RAM as 64-bit words, `pages` the
mem_map as int32 words (flags, refcount, pincount, mapcount per page).
"""

import struct
import sys

PTE_PRESENT = 1 << 0
PTE_ADDR_MASK = 0x000FFFFFFFFFF000
PG_BUDDY = 1 << 1
PG_DIRTY = 1 << 2
_FLAGS, _REF, _PIN, _MAP = 0, 1, 2, 3
_U64 = (1 << 64) - 1  # C's uint64_t arithmetic wraps modulo 2^64


def _walk_to_pte_table(mem, pgd: int, va: int) -> int:
    bits = mem.page_shift - 3
    ram_size = mem.nr_pages << mem.page_shift
    table = pgd
    for level in range(mem.levels - 1, 0, -1):
        idx = (va >> (mem.page_shift + level * bits)) & ((1 << bits) - 1)
        e = mem.ram_q[(table >> 3) + idx]
        if not e & PTE_PRESENT:
            return 0
        table = e & PTE_ADDR_MASK & ~((1 << mem.page_shift) - 1)
        if table == 0 or table >= ram_size:
            return 0
    return table


def pte_get(mem, pgd, va):
    table = _walk_to_pte_table(mem, pgd, va)
    if not table:
        return 0
    return mem.ram_q[(table >> 3) + ((va >> mem.page_shift) & ((1 << (mem.page_shift - 3)) - 1))]


def page_at(mem, pgd, va, length, need, task_size):
    ps = 1 << mem.page_shift
    off = va & (ps - 1)
    if length == 0 or length > ps - off or va >= task_size or length > task_size - va:
        return -1
    pte = pte_get(mem, pgd, va)
    if pte & need != need:
        return -1
    return (pte & PTE_ADDR_MASK) + off


def gup_fast(mem, pgd, start, nr, need, deny, pfns, off):
    shift = mem.page_shift
    bits = shift - 3
    span = 1 << (shift + bits)
    emask = (1 << bits) - 1
    pages = mem.pages
    table, table_base = 0, -1
    for i in range(nr):
        va = start + (i << shift)
        base = va & ~(span - 1)
        if base != table_base:
            table = _walk_to_pte_table(mem, pgd, va)
            if not table:
                return i
            table_base = base
        pte = mem.ram_q[(table >> 3) + ((va >> shift) & emask)]
        if (pte & need) != need or (pte & deny):
            return i
        pfn = (pte & PTE_ADDR_MASK) >> shift
        if pfn >= mem.nr_pages:
            return i
        p = pfn * 4
        if pages[p + _REF] <= 0 or pages[p + _FLAGS] & PG_BUDDY:
            return i
        pages[p + _REF] += 1
        pages[p + _PIN] += 1
        pfns[off + i] = pfn
    return nr


def pin_append(mem, pgd, start, npages, batch, need, deny, page_list, max_seg, sg_pfn,
               sg_off, sg_len, nents, cap):
    shift = mem.page_shift
    done = 0
    while done < npages:
        want = min(batch, npages - done)
        if cap - nents < want:
            break
        got = gup_fast(mem, pgd, start + (done << shift), want, need, deny, page_list, 0)
        if got > 0:
            r = sg_append(shift, page_list, got, 0, got << shift, max_seg, sg_pfn, sg_off,
                          sg_len, nents, cap)
            if r < 0:
                return -1, nents
            nents = r
            done += got
        if got < want:
            break
    return done, nents


def count_pages(lens, n, shift):
    rnd = (1 << shift) - 1
    return sum((lens[i] + rnd) >> shift for i in range(n))


def unpin(mem, pfns, counts, n, len_shift, dirty, freed):
    pages = mem.pages
    nfreed = 0
    done = 0
    rnd = (1 << len_shift) - 1 if len_shift >= 0 else 0
    for i in range(n):
        cnt = 1 if counts is None else counts[i] if len_shift < 0 else \
            (counts[i] + rnd) >> len_shift
        for j in range(cnt):
            pfn = pfns[i] + j
            p = pfn * 4
            if pfn >= mem.nr_pages or pages[p + _PIN] <= 0 or pages[p + _REF] <= 0:
                return -1, (pfn, nfreed, done)
            done += 1
            pages[p + _PIN] -= 1
            if dirty:
                pages[p + _FLAGS] |= PG_DIRTY
            pages[p + _REF] -= 1
            if pages[p + _REF] == 0:
                freed[nfreed] = pfn
                nfreed += 1
    return nfreed, None


def sg_append(page_shift, pfns, n, offset, size, max_seg, sg_pfn, sg_off, sg_len, nents, cap):
    psize = 1 << page_shift
    i = 0
    added = 0
    if nents > 0 and n > 0:
        prv = nents - 1
        next_pfn = ((sg_pfn[prv] << page_shift) + sg_off[prv] + sg_len[prv]) >> page_shift
        prv_len = sg_len[prv]
        if pfns[0] == next_pfn:
            last = next_pfn - 1
            while i < n and pfns[i] == last + 1:
                if prv_len + psize > max_seg:
                    break
                prv_len += psize
                last = pfns[i]
                i += 1
            sg_len[prv] = prv_len
    while i < n:
        j = i + 1
        seg = 0
        while j < n:
            seg += psize
            if seg >= max_seg or pfns[j] != pfns[j - 1] + 1:
                break
            j += 1
        chunk = ((j - i) << page_shift) - offset
        if nents + added >= cap:
            return -1
        sg_pfn[nents + added] = pfns[i]
        sg_off[nents + added] = offset
        sg_len[nents + added] = min(size, chunk)
        added += 1
        size = size - chunk if size > chunk else 0
        offset = 0
        i = j
    return nents + added


def dma_map_direct(page_shift, sg_pfn, sg_off, sg_len, n, dma_mask, dma_addr, dma_len):
    for i in range(n):
        addr = (sg_pfn[i] << page_shift) + sg_off[i]
        if sg_len[i] and addr + sg_len[i] - 1 > dma_mask:
            return -(i + 1)
        dma_addr[i] = addr
        dma_len[i] = sg_len[i]
    return n


def dma_map_iova(page_shift, granule_shift, sg_pfn, sg_off, sg_len, n, iova, max_seg,
                 seg_iova, dma_addr, dma_len):
    seg_mask = 0xFFFFFFFF
    gmask = (1 << granule_shift) - 1
    cur_len = 0
    count = 0
    for i in range(n):
        phys = (sg_pfn[i] << page_shift) + sg_off[i]
        s_off = phys & gmask
        s_len = sg_len[i]
        s_iova_len = (s_off + s_len + gmask) & ~gmask
        seg_iova[i] = iova
        # (max_seg - cur_len) is unsigned in C (and in the kernel): when one entry alone
        # is longer than max_seg the difference wraps, and the next entry still merges
        if cur_len and not s_off and (iova & seg_mask) and (max_seg - cur_len) & _U64 >= s_len:
            cur_len += s_len
        else:
            count += 1
            cur_len = s_len
            dma_addr[count - 1] = iova + s_off
        dma_len[count - 1] = cur_len
        iova += s_iova_len
        if s_len + s_off < s_iova_len:
            cur_len = 0
    return count


def dma_blocks(dma_addr, dma_len, nents, advance, pg_bit, nblocks, or_flags, big_endian, out):
    pgsz = 1 << pg_bit
    mask = pgsz - 1
    sg = count = 0
    while count < nblocks and sg < nents:
        dma = (dma_addr[sg] + advance) & _U64
        delta = pgsz - (dma & mask)
        block = (dma & ~mask) | or_flags
        while sg < nents and (dma_len[sg] - advance) & _U64 <= delta:
            delta -= (dma_len[sg] - advance) & _U64
            advance = 0
            sg += 1
        advance = (advance + delta) & _U64
        # to_be64(): the value's bytes most significant first, read back natively
        out[count] = int.from_bytes(block.to_bytes(8, "big"), sys.byteorder) if big_endian \
            else block
        count += 1
    return count


def pgsz_mask(dma_addr, dma_len, nents, va, pgoff):
    mask, curr_base, curr_len = 0, _U64, 0
    for i in range(nents):
        dma = dma_addr[i]
        end = curr_base + curr_len
        if end > _U64 or end != dma:  # check_add_overflow() or a physical discontinuity
            curr_base, curr_len = dma, 0
            mask |= ((dma + pgoff) & _U64) ^ va
            if i:
                mask |= va
        curr_len += dma_len[i]
        va = (va + dma_len[i] - pgoff) & _U64
        pgoff = 0
    return mask


def scan_pages(mem, start, out, cap):
    pages = mem.pages
    k = 0
    for pfn in range(start, mem.nr_pages):
        if k >= cap:
            break
        p = pfn * 4
        if pages[p + _REF] or pages[p + _PIN] or pages[p + _MAP]:
            out[k] = pfn
            k += 1
    return k


def next_set(a, start, stop):
    for i in range(start, stop):
        if a[i]:
            return i
    return stop


def ksm_fill(out, first, n, size, key, shift):
    raw = bytearray(16 * n)
    for i in range(n):
        struct.pack_into(">IIQ", raw, 16 * i, size, key, ((first + i) << shift) & _U64)
    out[: 2 * n] = memoryview(raw).cast("Q")


_LOW_BITS = bytes(b & 3 for b in range(256))


def mtt_absent(mtt, n):
    # each entry's last byte in memory is its lowest (big-endian): the present bits
    lows = mtt[:n].tobytes()[7::8].translate(_LOW_BITS)
    return lows.count(3) != len(lows)


def sg_congruent(dma_addr, dma_len, nents, va, pps):
    mask = pps - 1
    at = va
    for i in range(nents):
        if (dma_addr[i] - at) & mask:
            return i, at - va
        if dma_len[i] > _U64 - at:
            return -(i + 2), at - va
        at += dma_len[i]
    return -1, at - va


def mtt_pieces(mtt, nmtt, pg_bit, offset, length, addr, plen, cap):
    pgsz = 1 << pg_bit
    mask = pgsz - 1
    idx, within = offset >> pg_bit, offset & mask
    n = 0
    while length:
        if idx >= nmtt:
            return -1
        # be64_to_cpu() of the stored entry, then drop the permission bits
        dma = (int.from_bytes(mtt[idx].to_bytes(8, sys.byteorder), "big") & ~mask) + within
        run = min(pgsz - within, length)
        if n and addr[n - 1] + plen[n - 1] == dma:
            plen[n - 1] += run
        else:
            if n == cap:
                return -1
            addr[n] = dma
            plen[n] = run
            n += 1
        length -= run
        within = 0
        idx += 1
    return n


def dma_copy(dst, dst_size, dst_addr, dst_len, ndst, src, src_size, src_addr, src_len, nsrc):
    for addrs, lens, n, size in ((dst_addr, dst_len, ndst, dst_size),
                                 (src_addr, src_len, nsrc, src_size)):
        for i in range(n):
            if addrs[i] > size or lens[i] > size - addrs[i]:
                return -1
    d = s = doff = soff = done = 0
    while d < ndst and s < nsrc:
        k = min(dst_len[d] - doff, src_len[s] - soff)
        da, sa = dst_addr[d] + doff, src_addr[s] + soff
        dst[da:da + k] = src[sa:sa + k]
        done += k
        doff += k
        soff += k
        if doff == dst_len[d]:
            d, doff = d + 1, 0
        if soff == src_len[s]:
            s, soff = s + 1, 0
    return done


BAR1_BAD_PAGE = -(1 << 62)


def bar1_map(pages, n, npg, win_of_page, refs, free_stack, free_top, bar1_pte, max_new,
             win_out):
    need = 0
    for i in range(n):
        if pages[i] >= npg:
            return BAR1_BAD_PAGE
        if not win_of_page[pages[i]]:
            need += 1
    if need > max_new or need > free_top[0]:
        return -need - 1
    for i in range(n):
        p = pages[i]
        if not win_of_page[p]:
            free_top[0] -= 1
            w = free_stack[free_top[0]]
            win_of_page[p] = w + 1
            bar1_pte[w] = p + 1
        refs[p] += 1
        win_out[i] = win_of_page[p] - 1
    return need


def bar1_unmap(pages, n, npg, win_of_page, refs, free_stack, free_top, bar1_pte):
    freed = 0
    for i in range(n):
        if pages[i] >= npg or not refs[pages[i]]:
            return BAR1_BAD_PAGE
    for i in range(n - 1, -1, -1):
        p = pages[i]
        refs[p] -= 1
        if refs[p]:
            continue
        w = win_of_page[p] - 1
        bar1_pte[w] = 0
        win_of_page[p] = 0
        free_stack[free_top[0]] = w
        free_top[0] += 1
        freed += 1
    return freed
