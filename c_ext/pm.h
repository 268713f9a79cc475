/*
 * pm.h - the per-page loops of peermem-model, behind one private header.
 *
 * Everything here is a bounded loop over pages or scatterlist entries.  The
 * functions take pointers, counts and integers and never call back into
 * Python; each has a pure-Python twin in c_ext/twins.py that the tests run
 * against the same inputs.
 *
 * Emulated physical memory is a flat byte array (ram) plus a mem_map of
 * struct page records.  Page tables are 64-bit words inside ram, in the x86-64
 * layout: present/rw/user/special bits and the physical address in 12..51.
 */
#include <stddef.h>
#include <stdint.h>

#define PM_PTE_PRESENT   (1ull << 0)
#define PM_PTE_RW        (1ull << 1)
#define PM_PTE_USER      (1ull << 2)
#define PM_PTE_SPECIAL   (1ull << 9)
#define PM_PTE_ADDR_MASK 0x000ffffffffff000ull

#define PM_PG_RESERVED   (1u << 0)
#define PM_PG_BUDDY      (1u << 1)
#define PM_PG_DIRTY      (1u << 2)

struct page {			/* the emulated struct page: 16 bytes */
	uint32_t flags;
	int32_t refcount;	/* page_ref_count() */
	int32_t pincount;	/* FOLL_PIN references */
	int32_t mapcount;	/* PTEs mapping it (0-based, see EMU note) */
};

struct pm_mem {			/* one machine's memory, shared by every call */
	uint8_t *ram;
	struct page *mem_map;
	uint64_t nr_pages;	/* pages of RAM */
	int page_shift;
	int levels;		/* page-table levels */
};

long pm_gup_fast(const struct pm_mem *m, uint64_t pgd, uint64_t start,
		 long nr, uint64_t need, uint64_t deny, uint64_t *pfns);
uint64_t pm_pte_get(const struct pm_mem *m, uint64_t pgd, uint64_t va);
int64_t pm_page_at(const struct pm_mem *m, uint64_t pgd, uint64_t va,
		   uint64_t len, uint64_t need, uint64_t task_size);
long pm_unpin(const struct pm_mem *m, const uint64_t *pfns,
	      const uint64_t *counts, long n, int len_shift, int dirty,
	      uint64_t *freed, uint64_t *err);
uint64_t pm_count_pages(const uint64_t *lens, long n, int shift);
long pm_pin_append(const struct pm_mem *m, uint64_t pgd, uint64_t start,
		   long npages, long batch, uint64_t need, uint64_t deny,
		   uint64_t *page_list, uint64_t max_seg, uint64_t *sg_pfn,
		   uint64_t *sg_off, uint64_t *sg_len, long *nents, long cap);
long pm_sg_append(int page_shift, const uint64_t *pfns, long n,
		  uint64_t offset, uint64_t size, uint64_t max_seg,
		  uint64_t *sg_pfn, uint64_t *sg_off, uint64_t *sg_len,
		  long nents, long cap);
long pm_dma_map_direct(int page_shift, const uint64_t *sg_pfn,
		       const uint64_t *sg_off, const uint64_t *sg_len, long n,
		       uint64_t dma_mask, uint64_t *dma_addr, uint64_t *dma_len);
long pm_dma_map_iova(int page_shift, int granule_shift,
		     const uint64_t *sg_pfn, const uint64_t *sg_off,
		     const uint64_t *sg_len, long n, uint64_t iova,
		     uint64_t max_seg, uint64_t *seg_iova,
		     uint64_t *dma_addr, uint64_t *dma_len);
long pm_scan_pages(const struct pm_mem *m, uint64_t from, uint64_t *out,
		   long cap);
long pm_dma_blocks(const uint64_t *dma_addr, const uint64_t *dma_len,
		   long nents, uint64_t advance, int pg_bit, long nblocks,
		   uint64_t or_flags, int big_endian, uint64_t *out);
uint64_t pm_pgsz_mask(const uint64_t *dma_addr, const uint64_t *dma_len,
		      long nents, uint64_t va, uint64_t pgoff);
long pm_baseline_pin_map(const struct pm_mem *m, uint64_t pgd, uint64_t start,
			 long nr, uint64_t max_seg, uint64_t *pfns,
			 uint64_t *sg_pfn, uint64_t *sg_len,
			 uint64_t *dma_addr);
#define PM_BAR1_BAD_PAGE (-(1L << 62))

long pm_bar1_map(const uint64_t *pages, long n, uint64_t npg, uint64_t *win_of_page,
		 uint64_t *refs, uint64_t *free_stack, uint64_t *free_top, uint64_t *bar1_pte,
		 long max_new, uint64_t *win_out);
long pm_bar1_unmap(const uint64_t *pages, long n, uint64_t npg, uint64_t *win_of_page,
		   uint64_t *refs, uint64_t *free_stack, uint64_t *free_top,
		   uint64_t *bar1_pte);
long pm_baseline_peer_table(const uint64_t *gpu_pages, long n, uint64_t *bar1_pte,
			    uint64_t first_window, uint64_t bar1_base, int gpu_page_shift,
			    uint64_t *phys, uint64_t *sg_len, uint64_t *dma_addr,
			    uint64_t *dma_len);
long pm_mtt_pieces(const uint64_t *mtt, long nmtt, int pg_bit,
		   uint64_t offset, uint64_t len, uint64_t *addr, uint64_t *plen,
		   long cap);
int pm_mtt_absent(const uint64_t *mtt, long n);
long pm_next_set(const uint64_t *a, long from, long to);
void pm_ksm_fill(uint64_t *out, uint64_t first, long n, uint32_t size, uint32_t key,
		 int shift);
long pm_sg_congruent(const uint64_t *dma_addr, const uint64_t *dma_len, long nents,
		     uint64_t va, uint64_t pps, uint64_t *total);
long pm_dma_copy(uint8_t *dst, uint64_t dst_size, const uint64_t *dst_addr,
		 const uint64_t *dst_len, long ndst, const uint8_t *src,
		 uint64_t src_size, const uint64_t *src_addr,
		 const uint64_t *src_len, long nsrc);

/* Zeroed memory for a lazy c_ext.U64Array: fresh anonymous pages, zeroed by the
 * kernel as they are touched, where ffi.new would memset every page. */
void *pm_calloc(size_t size);
void pm_free(void *p);

/* The cache of freed large blocks the registration paths' arrays come from. */
void *pm_pool_alloc(size_t size);
void pm_pool_free(void *p);
void pm_pool_stats(uint64_t *out);
