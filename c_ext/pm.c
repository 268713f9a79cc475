/*
 * pm.c - the per-page loops.  See pm.h for the memory layout.
 *
 * Each function mirrors one inner loop of the kernel: the gup fast-path walk
 * (mm/gup.c), unpinning (unpin_user_page_range_dirty_lock), scatterlist
 * coalescing (lib/scatterlist.c), DMA address filling for a direct
 * mapping (kernel/dma/direct.c) or an IOMMU (drivers/iommu/dma-iommu.c),
 * and splitting a mapped table into device-page blocks for an MTT/PAS
 * (drivers/infiniband/core/iter.c).
 * The checks that need Python state (VMAs, rlimits, errno messages) are done
 * by the callers before and after; these loops only stop, never fail loudly.
 */
#define _DEFAULT_SOURCE		/* MAP_ANONYMOUS under -std=c99 */
#include <stdlib.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif
#include <string.h>
#include <pthread.h>
#include "pm.h"

static inline uint64_t rd64(const struct pm_mem *m, uint64_t phys)
{
	uint64_t v;

	memcpy(&v, m->ram + phys, sizeof(v));
	return v;
}

/* Walk from the root table down to the PTE table covering va; 0 if absent. */
static uint64_t walk_to_pte_table(const struct pm_mem *m, uint64_t pgd,
				  uint64_t va)
{
	int bits = m->page_shift - 3;
	uint64_t ram_size = m->nr_pages << m->page_shift;
	uint64_t table = pgd;

	for (int level = m->levels - 1; level >= 1; level--) {
		int shift = m->page_shift + level * bits;
		uint64_t idx = (va >> shift) & ((1ull << bits) - 1);
		uint64_t e = rd64(m, table + idx * 8);

		if (!(e & PM_PTE_PRESENT))
			return 0;
		/*
		 * A table is one page: address bits below the page size are
		 * ignored (as the arm64 64K-granule descriptor does), so a
		 * corrupt entry can't point the next read past the end of ram.
		 */
		table = e & PM_PTE_ADDR_MASK & ~((1ull << m->page_shift) - 1);
		if (table == 0 || table >= ram_size)
			return 0;
	}
	return table;
}

/* The PTE mapping va (follow_pte's walk, as the MMU does it); 0 if no table covers va. */
uint64_t pm_pte_get(const struct pm_mem *m, uint64_t pgd, uint64_t va)
{
	uint64_t table = walk_to_pte_table(m, pgd, va);
	int bits = m->page_shift - 3;

	if (!table)
		return 0;
	return rd64(m, table + ((va >> m->page_shift) & ((1ull << bits) - 1)) * 8);
}

/*
 * The TLB hit a load or store takes before the page walk (memory.page_at):
 * the physical address of [va, va + len) when the range lies in one page
 * below task_size whose PTE has every bit of need; -1 for anything else,
 * which sends the caller down the faulting walk.
 */
int64_t pm_page_at(const struct pm_mem *m, uint64_t pgd, uint64_t va,
		   uint64_t len, uint64_t need, uint64_t task_size)
{
	uint64_t ps = 1ull << m->page_shift, off = va & (ps - 1), pte;

	if (len == 0 || len > ps - off || va >= task_size || len > task_size - va)
		return -1;
	pte = pm_pte_get(m, pgd, va);
	if ((pte & need) != need)
		return -1;
	return (int64_t)((pte & PM_PTE_ADDR_MASK) + off);
}

/*
 * gup fast path: pin nr pages from start while each PTE has every bit of
 * need and none of deny, maps RAM, and its page can take a reference.
 * Returns how many were pinned; the caller's slow path takes over there.
 */
long pm_gup_fast(const struct pm_mem *m, uint64_t pgd, uint64_t start,
		 long nr, uint64_t need, uint64_t deny, uint64_t *pfns)
{
	int shift = m->page_shift, bits = shift - 3;
	uint64_t span = 1ull << (shift + bits);	/* bytes per PTE table */
	uint64_t entries_mask = (1ull << bits) - 1;
	uint64_t table = 0, table_base = ~0ull;

	for (long i = 0; i < nr; i++) {
		uint64_t va = start + ((uint64_t)i << shift);
		uint64_t base = va & ~(span - 1);

		if (base != table_base) {
			table = walk_to_pte_table(m, pgd, va);
			if (!table)
				return i;
			table_base = base;
		}
		uint64_t pte = rd64(m, table + ((va >> shift) & entries_mask) * 8);
		if ((pte & need) != need || (pte & deny))
			return i;
		uint64_t pfn = (pte & PM_PTE_ADDR_MASK) >> shift;
		if (pfn >= m->nr_pages)
			return i;
		struct page *p = &m->mem_map[pfn];
		if (p->refcount <= 0 || (p->flags & PM_PG_BUDDY))
			return i;	/* try_grab_folio() would fail */
		p->refcount++;
		p->pincount++;
		pfns[i] = pfn;
	}
	return nr;
}

/*
 * Drop one pin from each page of n ranges (counts NULL: one page each; with
 * len_shift >= 0 the counts are byte lengths, each DIV_ROUND_UP'd to pages of
 * 2^len_shift bytes, so a release hands its sg lengths over as they are).
 * Pages whose last reference goes are written to freed; the return value is
 * how many.  An unpin of a page that holds no pin stops with -1, leaving
 * err[0] = that pfn, err[1] = pages freed and err[2] = pages unpinned before
 * it, so the caller can still account for the work already done.
 */
long pm_unpin(const struct pm_mem *m, const uint64_t *pfns,
	      const uint64_t *counts, long n, int len_shift, int dirty,
	      uint64_t *freed, uint64_t *err)
{
	long nfreed = 0;
	uint64_t done = 0;
	uint64_t round = len_shift < 0 ? 0 : (1ull << len_shift) - 1;

	for (long i = 0; i < n; i++) {
		uint64_t cnt = !counts ? 1 : len_shift < 0 ? counts[i] :
			       (counts[i] + round) >> len_shift;

		for (uint64_t j = 0; j < cnt; j++, done++) {
			uint64_t pfn = pfns[i] + j;
			struct page *p;

			if (pfn >= m->nr_pages)
				goto bad;
			p = &m->mem_map[pfn];
			if (p->pincount <= 0 || p->refcount <= 0)
				goto bad;
			p->pincount--;
			if (dirty)
				p->flags |= PM_PG_DIRTY;
			if (--p->refcount == 0)
				freed[nfreed++] = pfn;
			continue;
bad:
			err[0] = pfn;
			err[1] = nfreed;
			err[2] = done;
			return -1;
		}
	}
	return nfreed;
}

/*
 * ib_umem_get()'s loop in one call: pin `batch` pages at a time by the fast path
 * (pm_gup_fast) and append each batch to the sg table (pm_sg_append, offset 0),
 * until npages are in, a batch comes back short - a page the fast path cannot
 * pin, left to the caller's slow path - or the table has no room for another
 * batch's worst case (one entry per page), for the caller to grow it and call
 * again.  What was pinned is appended either way.  Returns the pages pinned and
 * appended; *nents is the table's new count.  Since room is checked before each
 * batch is pinned, the append cannot overflow (-1 if it did: a bug).
 */
long pm_pin_append(const struct pm_mem *m, uint64_t pgd, uint64_t start,
		   long npages, long batch, uint64_t need, uint64_t deny,
		   uint64_t *page_list, uint64_t max_seg, uint64_t *sg_pfn,
		   uint64_t *sg_off, uint64_t *sg_len, long *nents, long cap)
{
	int shift = m->page_shift;
	long done = 0;

	while (done < npages) {
		long want = npages - done < batch ? npages - done : batch;
		long got;

		if (cap - *nents < want)
			break;
		got = pm_gup_fast(m, pgd, start + ((uint64_t)done << shift), want,
				  need, deny, page_list);

		if (got > 0) {
			long r = pm_sg_append(shift, page_list, got, 0,
					      (uint64_t)got << shift, max_seg, sg_pfn,
					      sg_off, sg_len, *nents, cap);
			if (r < 0)
				return -1;
			*nents = r;
			done += got;
		}
		if (got < want)
			break;
	}
	return done;
}

/*
 * The pages n byte lengths cover, each rounded up to 2^shift bytes: the sum of
 * DIV_ROUND_UP(sg->length, PAGE_SIZE) that __ib_umem_release unpins.
 */
uint64_t pm_count_pages(const uint64_t *lens, long n, int shift)
{
	uint64_t total = 0, round = (1ull << shift) - 1;

	for (long i = 0; i < n; i++)
		total += (lens[i] + round) >> shift;
	return total;
}

/*
 * sg_alloc_append_table_from_pages(): first extend the previous entry (if
 * any) while the new pages follow it physically, then cut the rest into
 * chunks of consecutive PFNs no longer than max_seg.  Returns the new count.
 * Writing stops with -1 if the entries would not fit in cap (the caller
 * sizes the table with the counting pass first); max_seg must be >= a page.
 */
long pm_sg_append(int page_shift, const uint64_t *pfns, long n,
		  uint64_t offset, uint64_t size, uint64_t max_seg,
		  uint64_t *sg_pfn, uint64_t *sg_off, uint64_t *sg_len,
		  long nents, long cap)
{
	uint64_t psize = 1ull << page_shift;
	long i = 0;

	uint64_t prv_len = 0;
	long added = 0;

	if (nents > 0 && n > 0) {
		long prv = nents - 1;
		uint64_t next_pfn = ((sg_pfn[prv] << page_shift) + sg_off[prv] +
				     sg_len[prv]) >> page_shift;

		prv_len = sg_len[prv];
		if (pfns[0] == next_pfn) {
			uint64_t last = next_pfn - 1;

			while (i < n && pfns[i] == last + 1) {
				if (prv_len + psize > max_seg)
					break;
				prv_len += psize;
				last = pfns[i++];
			}
			sg_len[prv] = prv_len;
		}
	}
	while (i < n) {
		long j = i + 1;
		uint64_t seg = 0, chunk;

		for (; j < n; j++) {
			seg += psize;
			if (seg >= max_seg || pfns[j] != pfns[j - 1] + 1)
				break;
		}
		chunk = ((uint64_t)(j - i) << page_shift) - offset;
		if (nents + added >= cap)
			return -1;
		sg_pfn[nents + added] = pfns[i];
		sg_off[nents + added] = offset;
		sg_len[nents + added] = size < chunk ? size : chunk;
		added++;
		size = size > chunk ? size - chunk : 0;
		offset = 0;
		i = j;
	}
	return nents + added;
}

/*
 * dma_direct_map_sg(): bus address = physical address, one DMA segment per
 * CPU entry.  Returns n, or -(i + 1) for the first entry the mask can't reach.
 */
long pm_dma_map_direct(int page_shift, const uint64_t *sg_pfn,
		       const uint64_t *sg_off, const uint64_t *sg_len, long n,
		       uint64_t dma_mask, uint64_t *dma_addr, uint64_t *dma_len)
{
	for (long i = 0; i < n; i++) {
		uint64_t addr = (sg_pfn[i] << page_shift) + sg_off[i];

		if (sg_len[i] && addr + sg_len[i] - 1 > dma_mask)
			return -(i + 1);
		dma_addr[i] = addr;
		dma_len[i] = sg_len[i];
	}
	return n;
}

/*
 * iommu_dma_map_sg() + __finalise_sg(): lay the entries out back to back in
 * one IOVA range starting at iova (each padded to the IOVA granule), record
 * where each landed in seg_iova, and merge neighbours into DMA segments when
 * the next one starts on a granule boundary and the result fits max_seg
 * without crossing a 4 GiB segment boundary.  Returns the DMA segment count.
 */
long pm_dma_map_iova(int page_shift, int granule_shift,
		     const uint64_t *sg_pfn, const uint64_t *sg_off,
		     const uint64_t *sg_len, long n, uint64_t iova,
		     uint64_t max_seg, uint64_t *seg_iova,
		     uint64_t *dma_addr, uint64_t *dma_len)
{
	const uint64_t seg_mask = 0xffffffffull;
	uint64_t gmask = (1ull << granule_shift) - 1;
	uint64_t cur_len = 0;
	long count = 0;

	for (long i = 0; i < n; i++) {
		uint64_t phys = (sg_pfn[i] << page_shift) + sg_off[i];
		uint64_t s_off = phys & gmask;
		uint64_t s_len = sg_len[i];
		uint64_t s_iova_len = (s_off + s_len + gmask) & ~gmask;

		seg_iova[i] = iova;
		if (cur_len && !s_off && (iova & seg_mask) &&
		    max_seg - cur_len >= s_len) {
			cur_len += s_len;
		} else {
			count++;
			cur_len = s_len;
			dma_addr[count - 1] = iova + s_off;
		}
		dma_len[count - 1] = cur_len;
		iova += s_iova_len;
		if (s_len + s_off < s_iova_len)
			cur_len = 0;
	}
	return count;
}

/*
 * cpu_to_be64(): the bytes of v, most significant first, whatever the host.
 * GCC and clang know the host's byte order and have a one-instruction swap; the
 * byte loop (any other compiler) is not turned into one - it made a 262,144-entry
 * MTT fill 5x slower.
 */
static inline uint64_t to_be64(uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return __builtin_bswap64(v);
#elif defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	return v;
#else
	uint64_t r;
	unsigned char *p = (unsigned char *)&r;

	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (56 - 8 * i));
	return r;
#endif
}

/*
 * rdma_umem_for_each_dma_block() (__rdma_block_iter_next in iter.c), fused
 * with the driver's store: cut the DMA segments into aligned blocks of
 * 2^pg_bit bytes, starting `advance` bytes into the first segment, and write
 * each block's aligned address | or_flags (big-endian if asked, as a PAS or
 * MTT entry) to out.  A block that ends inside a segment resumes there; one
 * that reaches past a segment's end skips to the next.  Stops after nblocks
 * blocks or when the segments run out; returns the count written.
 */
long pm_dma_blocks(const uint64_t *dma_addr, const uint64_t *dma_len,
		   long nents, uint64_t advance, int pg_bit, long nblocks,
		   uint64_t or_flags, int big_endian, uint64_t *out)
{
	uint64_t pgsz = 1ull << pg_bit, mask = pgsz - 1;
	long sg = 0, count = 0;

	while (count < nblocks && sg < nents) {
		uint64_t dma = dma_addr[sg] + advance;
		uint64_t delta = pgsz - (dma & mask);	/* bytes to the block's end */
		uint64_t block = (dma & ~mask) | or_flags;

		while (sg < nents && dma_len[sg] - advance <= delta) {
			delta -= dma_len[sg] - advance;
			advance = 0;
			sg++;
		}
		advance += delta;
		out[count++] = big_endian ? to_be64(block) : block;
	}
	return count;
}

/*
 * ib_umem_find_best_pgsz()'s walk: the address bits in which the device
 * address (va, advancing with each segment) and the DMA address differ at
 * the start of every physically contiguous run, plus va itself at each run
 * after the first (a new run must start a device page).  pgoff is the
 * umem's offset into its first page.  The caller masks the page sizes with it.
 */
uint64_t pm_pgsz_mask(const uint64_t *dma_addr, const uint64_t *dma_len,
		      long nents, uint64_t va, uint64_t pgoff)
{
	uint64_t mask = 0, curr_base = ~0ull, curr_len = 0, end;

	for (long i = 0; i < nents; i++) {
		uint64_t dma = dma_addr[i];

		if (__builtin_add_overflow(curr_base, curr_len, &end) || end != dma) {
			curr_base = dma;
			curr_len = 0;
			mask |= (dma + pgoff) ^ va;
			if (i)
				mask |= va;
		}
		curr_len += dma_len[i];
		va += dma_len[i] - pgoff;
		pgoff = 0;
	}
	return mask;
}

/* Collect up to cap PFNs from `from` on whose page holds any count. */
long pm_scan_pages(const struct pm_mem *m, uint64_t from, uint64_t *out,
		   long cap)
{
	long k = 0;

	for (uint64_t pfn = from; pfn < m->nr_pages && k < cap; pfn++) {
		const struct page *p = &m->mem_map[pfn];

		if (p->refcount || p->pincount || p->mapcount)
			out[k++] = pfn;
	}
	return k;
}

/*
 * Benchmark baseline only: the same walk + pin + coalesce + direct DMA fill
 * as pm_gup_fast, pm_sg_append and pm_dma_map_direct, fused into one loop
 * with no Python around it.  Returns the entry count, or -1 if any page fails.
 */
long pm_baseline_pin_map(const struct pm_mem *m, uint64_t pgd, uint64_t start,
			 long nr, uint64_t max_seg, uint64_t *pfns,
			 uint64_t *sg_pfn, uint64_t *sg_len,
			 uint64_t *dma_addr)
{
	int shift = m->page_shift, bits = shift - 3;
	uint64_t span = 1ull << (shift + bits), psize = 1ull << shift;
	uint64_t table = 0, table_base = ~0ull;
	long nents = 0;

	for (long i = 0; i < nr; i++) {
		uint64_t va = start + ((uint64_t)i << shift);

		if ((va & ~(span - 1)) != table_base) {
			table = walk_to_pte_table(m, pgd, va);
			if (!table)
				return -1;
			table_base = va & ~(span - 1);
		}
		uint64_t pte = rd64(m, table + ((va >> shift) & ((1ull << bits) - 1)) * 8);
		uint64_t pfn = (pte & PM_PTE_ADDR_MASK) >> shift;

		if (!(pte & PM_PTE_PRESENT) || pfn >= m->nr_pages)
			return -1;
		m->mem_map[pfn].refcount++;
		m->mem_map[pfn].pincount++;
		pfns[i] = pfn;
		if (nents && sg_pfn[nents - 1] + (sg_len[nents - 1] >> shift) == pfn &&
		    sg_len[nents - 1] + psize <= max_seg) {
			sg_len[nents - 1] += psize;
			continue;
		}
		sg_pfn[nents] = pfn;
		sg_len[nents] = psize;
		dma_addr[nents] = pfn << shift;
		nents++;
	}
	return nents;
}

/* be64_to_cpu(): the inverse of to_be64 (the same byte swap). */
static inline uint64_t from_be64(uint64_t v)
{
	return to_be64(v);
}

/*
 * Does any of the first n big-endian MTT entries lack one of the present bits
 * (MLX5_IB_MTT_READ | MLX5_IB_MTT_WRITE, the entry's two lowest bits)?  The
 * firmware asks at CREATE_MKEY and after each UMR of a page-fault-enabled mkey:
 * such an mkey faults on any access through an entry not present.
 */
int pm_mtt_absent(const uint64_t *mtt, long n)
{
	long i;

	for (i = 0; i < n; i++)
		if ((from_be64(mtt[i]) & 3) != 3)
			return 1;
	return 0;
}

/*
 * The first index in [from, to) whose entry is not 0, or `to`: the walks over a
 * sparse per-page table (an ODP umem's DMA list, mostly empty) step from one
 * mapped page to the next instead of visiting every page in Python.
 */
long pm_next_set(const uint64_t *a, long from, long to)
{
	long i;

	for (i = from; i < to; i++)
		if (a[i])
			return i;
	return to;
}

/*
 * n KSM entries (struct mlx5_ksm: a 32-bit size, a 32-bit key, a 64-bit address,
 * big-endian) into out[2n]: entry i maps the slice at (first + i) << shift
 * through `key` - populate_klm's entries on the null mkey, which a parent MR
 * of implicit ODP has for every slice that has no child.
 */
void pm_ksm_fill(uint64_t *out, uint64_t first, long n, uint32_t size, uint32_t key,
		 int shift)
{
	uint64_t head = to_be64((uint64_t)size << 32 | key);
	long i;

	for (i = 0; i < n; i++) {
		out[2 * i] = head;
		out[2 * i + 1] = to_be64((first + i) << shift);
	}
}

/*
 * The layout rule a peer client's dma_map table must keep (ib_peer_sg_violation):
 * read from VA `va` on, each entry's DMA address is congruent with the VA it
 * maps modulo `pps`, a power of two.  Returns the index of the first entry that
 * is not, or -1 when every one is; *total gets the bytes the entries cover up to
 * there (all of them when -1).  An entry whose length runs past the top of the
 * 64-bit address space ends the walk as -(its index + 2).
 */
long pm_sg_congruent(const uint64_t *dma_addr, const uint64_t *dma_len, long nents,
		     uint64_t va, uint64_t pps, uint64_t *total)
{
	uint64_t mask = pps - 1, at = va;
	long i;

	for (i = 0; i < nents; i++) {
		if ((dma_addr[i] - at) & mask) {
			*total = at - va;
			return i;
		}
		if (dma_len[i] > UINT64_MAX - at) {
			*total = at - va;
			return -(i + 2);
		}
		at += dma_len[i];
	}
	*total = at - va;
	return -1;
}

/*
 * The HCA's MTT walk: translate `len` bytes starting `offset` bytes into a
 * memory key's region (offset counted from the start of the first page) into
 * DMA pieces, merging pages whose addresses follow each other.  mtt[] holds
 * big-endian entries of 2^pg_bit-byte pages with permission bits below the
 * page size.  Returns the pieces written, or -1 if the range runs past the
 * table or more than cap pieces would be needed.
 */
long pm_mtt_pieces(const uint64_t *mtt, long nmtt, int pg_bit,
		   uint64_t offset, uint64_t len, uint64_t *addr, uint64_t *plen,
		   long cap)
{
	uint64_t pgsz = 1ull << pg_bit, mask = pgsz - 1;
	uint64_t idx = offset >> pg_bit, within = offset & mask;
	long n = 0;

	while (len) {
		uint64_t dma, run;

		if (idx >= (uint64_t)nmtt)
			return -1;
		dma = (from_be64(mtt[idx]) & ~mask) + within;
		run = pgsz - within;
		if (run > len)
			run = len;
		if (n && addr[n - 1] + plen[n - 1] == dma) {
			plen[n - 1] += run;
		} else {
			if (n == cap)
				return -1;
			addr[n] = dma;
			plen[n++] = run;
		}
		len -= run;
		within = 0;
		idx++;
	}
	return n;
}

/*
 * The byte mover of a DMA transfer: copy from the src pieces to the dst
 * pieces, in order, min(total src, total dst) bytes.  Each side is a flat
 * buffer (a machine's RAM or a packet's payload) and its pieces are (offset,
 * length) inside it; every piece is checked against the buffer before any
 * byte moves.  Returns the bytes copied, or -1 if a piece is out of bounds.
 */
long pm_dma_copy(uint8_t *dst, uint64_t dst_size, const uint64_t *dst_addr,
		 const uint64_t *dst_len, long ndst, const uint8_t *src,
		 uint64_t src_size, const uint64_t *src_addr,
		 const uint64_t *src_len, long nsrc)
{
	uint64_t doff = 0, soff = 0, done = 0;
	long d = 0, s = 0;

	for (long i = 0; i < ndst; i++)
		if (dst_addr[i] > dst_size || dst_len[i] > dst_size - dst_addr[i])
			return -1;
	for (long i = 0; i < nsrc; i++)
		if (src_addr[i] > src_size || src_len[i] > src_size - src_addr[i])
			return -1;
	while (d < ndst && s < nsrc) {
		uint64_t dl = dst_len[d] - doff, sl = src_len[s] - soff;
		uint64_t k = dl < sl ? dl : sl;

		memcpy(dst + dst_addr[d] + doff, src + src_addr[s] + soff, k);
		done += k;
		doff += k;
		soff += k;
		if (doff == dst_len[d]) {
			d++;
			doff = 0;
		}
		if (soff == src_len[s]) {
			s++;
			soff = 0;
		}
	}
	return (long)done;
}

/*
 * Benchmark-only yardstick for registering GPU memory: what nv-p2p and a peer
 * client do per GPU page, fused, with no Python around it - point a BAR1
 * window at the page, record the window's bus address in the page table, and
 * fill the HCA's sg entry (one GPU page long).  Returns n.
 */
long pm_baseline_peer_table(const uint64_t *gpu_pages, long n, uint64_t *bar1_pte,
			    uint64_t first_window, uint64_t bar1_base, int gpu_page_shift,
			    uint64_t *phys, uint64_t *sg_len, uint64_t *dma_addr,
			    uint64_t *dma_len)
{
	uint64_t psize = 1ull << gpu_page_shift;

	for (long i = 0; i < n; i++) {
		uint64_t w = first_window + (uint64_t)i;
		uint64_t bus = bar1_base + (w << gpu_page_shift);

		bar1_pte[w] = gpu_pages[i] + 1;
		phys[i] = bus;
		sg_len[i] = psize;
		dma_addr[i] = bus;
		dma_len[i] = psize;
	}
	return n;
}

/*
 * nv-p2p's BAR1 bookkeeping for one third-party mapping of n GPU pages:
 * a page nobody maps yet takes the window on top of the free stack (and the
 * BAR1 page table points that window at it); every page's use count goes up;
 * win_out[i] is page i's window.  win_of_page and bar1_pte hold index + 1,
 * 0 meaning none.  If the new windows would be more than max_new (the space
 * left above the reserve) or than the free stack holds, nothing is changed
 * and the result is -(windows needed) - 1.  Otherwise the result is the
 * number of new windows.  A page number >= npg is PM_BAR1_BAD_PAGE.
 */
long pm_bar1_map(const uint64_t *pages, long n, uint64_t npg, uint64_t *win_of_page,
		 uint64_t *refs, uint64_t *free_stack, uint64_t *free_top, uint64_t *bar1_pte,
		 long max_new, uint64_t *win_out)
{
	long need = 0;

	for (long i = 0; i < n; i++) {
		if (pages[i] >= npg)
			return PM_BAR1_BAD_PAGE;
		if (!win_of_page[pages[i]])
			need++;
	}
	if (need > max_new || (uint64_t)need > *free_top)
		return -need - 1;
	for (long i = 0; i < n; i++) {
		uint64_t p = pages[i];

		if (!win_of_page[p]) {
			uint64_t w = free_stack[--*free_top];

			win_of_page[p] = w + 1;
			bar1_pte[w] = p + 1;
		}
		refs[p]++;
		win_out[i] = win_of_page[p] - 1;
	}
	return need;
}

/*
 * The reverse: every page's use count goes down; a window nobody uses any more
 * is cleared in the BAR1 page table and pushed back - pages taken last to
 * first, so the next map pops them in ascending order again.  Returns the
 * windows freed, or PM_BAR1_BAD_PAGE (nothing changed) if a page is not mapped.
 */
long pm_bar1_unmap(const uint64_t *pages, long n, uint64_t npg, uint64_t *win_of_page,
		   uint64_t *refs, uint64_t *free_stack, uint64_t *free_top,
		   uint64_t *bar1_pte)
{
	long freed = 0;

	for (long i = 0; i < n; i++)	/* nothing changes unless every page is mapped */
		if (pages[i] >= npg || !refs[pages[i]])
			return PM_BAR1_BAD_PAGE;
	for (long i = n - 1; i >= 0; i--) {
		uint64_t p = pages[i];

		if (--refs[p])
			continue;
		uint64_t w = win_of_page[p] - 1;

		bar1_pte[w] = 0;
		win_of_page[p] = 0;
		free_stack[(*free_top)++] = w;
		freed++;
	}
	return freed;
}

/*
 * The allocator of a lazy U64Array (a large array of which a run touches a few
 * entries): its own anonymous mapping, unmapped when freed, which the kernel
 * hands out zeroed and faults in page by page as it is touched.  calloc would
 * do that only for the first such block: once one is freed glibc raises its
 * mmap threshold and serves the next from the heap, clearing every byte (a
 * GPU's 262,144-entry arrays, built for every machine the race explorer makes,
 * cost 50 us each that way).  Without mmap, calloc.  Each block starts with a
 * 16-byte header: the mapping's length, or 0 for a calloc'd block.
 */
#define PM_HDR 16

void *pm_calloc(size_t size)
{
	uint8_t *p;

	if (size > SIZE_MAX - PM_HDR)
		return NULL;
#if defined(MAP_ANONYMOUS)
	p = mmap(NULL, size + PM_HDR, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	*(size_t *)p = size + PM_HDR;
	return p + PM_HDR;
#endif
	p = calloc(1, size + PM_HDR);
	if (!p)
		return NULL;
	return p + PM_HDR;
}

void pm_free(void *ptr)
{
	uint8_t *p;
	size_t len;

	if (!ptr)
		return;
	p = (uint8_t *)ptr - PM_HDR;
	len = *(size_t *)p;
#if defined(MAP_ANONYMOUS)
	if (len) {
		munmap(p, len);
		return;
	}
#endif
	free(p);
}

/*
 * The allocator of the large arrays the registration paths make and drop on
 * every call (a 1 GiB GPU registration: thirteen 16,384-entry columns - the
 * page table, the DMA mapping, the scatterlist, the MTT and the firmware's copy
 * of it).  malloc hands blocks this size back to the kernel when they are freed,
 * so each new one costs a page fault per page, ~2.4 us each on these machines:
 * 195 of them were 40% of that registration.  Freed blocks from POOL_MIN to
 * POOL_MAX_BLOCK bytes are kept instead, up to POOL_CAP bytes in all, and a
 * request of the same rounded size takes the most recently freed one (still in
 * the cache).  Each block starts with a 16-byte header holding its rounded size.
 * cffi clears a block after pm_pool_alloc when the array must be zeroed, so a
 * reused block never shows its last user's data.  The lock: cffi may call in
 * without the GIL.
 */
#define POOL_MIN	(64UL << 10)
#define POOL_MAX_BLOCK	(32UL << 20)
#define POOL_CAP	(128UL << 20)
#define POOL_SLOTS	256

static size_t *pool_blk[POOL_SLOTS];
static long pool_n;
static size_t pool_bytes;
static uint64_t pool_hits, pool_misses;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t pool_round(size_t size)
{
	return (size + 4095) & ~(size_t)4095;
}

void *pm_pool_alloc(size_t size)
{
	size_t *h = NULL;
	size_t want = size;
	long i;

	if (size >= POOL_MIN && size <= POOL_MAX_BLOCK) {
		want = pool_round(size);	/* (POOL_MAX_BLOCK is a page multiple) */
		pthread_mutex_lock(&pool_lock);
		for (i = pool_n - 1; i >= 0; i--) {
			if (*pool_blk[i] == want) {
				h = pool_blk[i];
				pool_blk[i] = pool_blk[--pool_n];
				pool_bytes -= want;
				break;
			}
		}
		if (h)
			pool_hits++;
		else
			pool_misses++;
		pthread_mutex_unlock(&pool_lock);
	}
	if (!h) {
		if (want > SIZE_MAX - PM_HDR)
			return NULL;
		h = malloc(want + PM_HDR);
		if (!h)
			return NULL;
		*h = want;
	}
	return (uint8_t *)h + PM_HDR;
}

void pm_pool_free(void *ptr)
{
	size_t *h;

	if (!ptr)
		return;
	h = (size_t *)((uint8_t *)ptr - PM_HDR);
	if (*h >= POOL_MIN && *h <= POOL_MAX_BLOCK) {
		pthread_mutex_lock(&pool_lock);
		if (pool_n < POOL_SLOTS && pool_bytes + *h <= POOL_CAP) {
			pool_blk[pool_n++] = h;
			pool_bytes += *h;
			h = NULL;
		}
		pthread_mutex_unlock(&pool_lock);
	}
	free(h);
}

/* What the pool holds and has done: blocks, bytes, hits, misses. */
void pm_pool_stats(uint64_t *out)
{
	pthread_mutex_lock(&pool_lock);
	out[0] = pool_n;
	out[1] = pool_bytes;
	out[2] = pool_hits;
	out[3] = pool_misses;
	pthread_mutex_unlock(&pool_lock);
}
