// What only the in-memory store promises: expired entries are reclaimed and their memory
// given back (a long-lived process does not grow without bound), and every provider has its
// own table.
import { spawnSync } from 'node:child_process'
import path from 'node:path'

import { afterEach, describe, expect, it } from 'vitest'

import { MemoryLeaseProvider } from '../dist/esm/index.js'
import { sleep, uniqueKey } from './helpers/lease.js'

const LONG = 60_000

describe('MemoryLeaseProvider', () => {
  const opened: MemoryLeaseProvider[] = []
  const open = () => {
    const p = new MemoryLeaseProvider()
    opened.push(p)
    return p
  }
  afterEach(async () => {
    await Promise.allSettled(opened.splice(0).map((p) => p.close()))
  })

  it('size counts resident leases; re-acquire, losing and transfer add none; release removes them', async () => {
    const p = open()
    expect(p.size).toBe(0)
    const keys = Array.from({ length: 1_000 }, (_, i) => uniqueKey(`size-${i}`))
    await Promise.all(keys.map((k) => p.acquireLease(k, 'A', LONG)))
    expect(p.size).toBe(1_000)
    await Promise.all(keys.map((k) => p.acquireLease(k, 'A', LONG)))
    await Promise.all(keys.map((k) => p.acquireLease(k, 'B', LONG)))
    await Promise.all(keys.slice(0, 100).map((k) => p.transferLease(k, 'A', 'C', LONG)))
    await Promise.all(keys.map((k) => p.getLeaseOwner(k)))
    expect(p.size).toBe(1_000)
    await Promise.all(keys.slice(500).map((k) => p.releaseLease(k, 'A')))
    expect(p.size).toBe(500)
    // Calls that fail or find nothing must not create entries.
    await Promise.all(keys.slice(500).map((k) => p.renewLease(k, 'A', LONG)))
    await Promise.all(keys.slice(500).map((k) => p.transferLease(k, 'A', 'B', LONG)))
    await Promise.all(keys.slice(500).map((k) => p.releaseLease(k, 'A')))
    await Promise.all(keys.slice(500).map((k) => p.getLeaseOwner(k)))
    expect(p.size).toBe(500)
  })

  it('1M leases with a 50 ms TTL stop being resident soon after they expire', async () => {
    const p = open()
    const keeper = uniqueKey('keeper')
    await p.acquireLease(keeper, 'keeper', LONG)
    const total = 1_000_000
    const batch = 20_000
    let peak = 0
    for (let start = 0; start < total; start += batch) {
      const calls: Promise<unknown>[] = []
      for (let i = start; i < start + batch; i++) calls.push(p.acquireLease(`wave:${i}`, 'w', 50))
      await Promise.all(calls)
      peak = Math.max(peak, p.size)
    }
    // Sanity: the wave really went into the table before it expired.
    expect(peak).toBeGreaterThan(1_000)
    await sleep(1_500)
    await p.acquireLease(uniqueKey('after-wave'), 'x', LONG)
    expect(p.size).toBeLessThan(1_000)
    // Reclaiming expired entries must not touch live ones.
    expect(await p.getLeaseOwner(keeper)).toBe('keeper')
    expect(await p.getLeaseOwner('wave:0')).toBeUndefined()
    expect(await p.getLeaseOwner(`wave:${total - 1}`)).toBeUndefined()
  }, 60_000)

  it('leases nobody touches are swept on a timer that never keeps the process alive: a process that leaves its provider open exits once the sweep is done', () => {
    // 200k leases expire together with nobody calling: only the timer's sweep, in rounds,
    // reclaims them; the process then ends with its provider open and reachable.
    const script = `
      const { MemoryLeaseProvider } = require(${JSON.stringify(path.resolve(__dirname, '..', 'dist', 'cjs', 'index.js'))});
      (async () => {
        // Kept reachable, so only the timer being unref'd lets the process end.
        const p = (globalThis.provider = new MemoryLeaseProvider());
        const calls = [];
        for (let i = 0; i < 200000; i++) calls.push(p.acquireLease('k' + i, 'o', 2000));
        await Promise.all(calls);
        const held = p.size;
        await new Promise((r) => setTimeout(r, 3000));
        process.stdout.write(JSON.stringify({ held, after: p.size }));
      })();
    `
    const started = Date.now()
    const child = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000 })
    expect(child.signal, 'the process did not exit by itself').toBeNull()
    expect(child.status, child.stderr).toBe(0)
    expect(JSON.parse(child.stdout)).toStrictEqual({ held: 200_000, after: 0 })
    expect(Date.now() - started).toBeLessThan(15_000)
  }, 30_000)

  it('after 1M live leases expire, the process gives most of their memory back (the table shrinks, the freed pages are returned)', () => {
    // A process of its own, so nothing else moves its resident size.
    const child = spawnSync(process.execPath, [path.join(__dirname, 'fixtures', 'memory-rss.mjs')], { encoding: 'utf8', timeout: 60_000 })
    expect(child.status, child.stderr).toBe(0)
    const { base, peak, after, held, size } = JSON.parse(child.stdout) as Record<string, number>
    expect(held).toBe(1_000_000)
    expect(size).toBe(0)
    const grown = peak! - base!
    expect(grown, 'the leases took memory at all').toBeGreaterThan(100 * 2 ** 20)
    // Left over: about a quarter, mostly Node's own from the million calls; all of it
    // before the table shrank and the memory went back.
    expect(after! - base!, `base ${base} peak ${peak} after ${after}`).toBeLessThan(grown * 0.5)
  }, 60_000)

  it('a provider dropped without close() frees its table once collected: 20 of 100k leases each, one after another, take about one table of memory', () => {
    // A process of its own, so nothing else moves its resident size.
    const child = spawnSync(process.execPath, ['--expose-gc', path.join(__dirname, 'fixtures', 'memory-dropped.mjs')], {
      encoding: 'utf8',
      timeout: 60_000,
    })
    expect(child.status, child.stderr).toBe(0)
    const { base, one, end, rounds } = JSON.parse(child.stdout) as Record<string, number>
    expect(one, 'a table of 100k leases took memory at all').toBeGreaterThan(10 * 2 ** 20)
    // Kept, the tables would take `rounds` times one; freed, their memory is reused.
    expect(end! - base!, `base ${base} one ${one} end ${end}`).toBeLessThan(one! * (rounds! / 4))
  }, 60_000)

  it('keys around the 255 UTF-16 units the glue reads at once (a surrogate pair across the edge included) are held and told apart exactly', async () => {
    const p = open()
    const keys = [
      'x'.repeat(254),
      'x'.repeat(255),
      'x'.repeat(256),
      'x'.repeat(254) + '\u{1F600}',
      'x'.repeat(253) + '\u{1F600}',
      '\u00e9'.repeat(255),
      '\u00e9'.repeat(254) + 'e',
    ]
    for (const [i, key] of keys.entries()) expect(await p.acquireLease(key, `o${i}`, LONG)).toEqual({ acquired: true, owner: `o${i}` })
    for (const [i, key] of keys.entries()) expect(await p.getLeaseOwner(key)).toBe(`o${i}`)
    expect(p.size).toBe(keys.length)
    // A lone surrogate just past the edge is still refused, not read as U+FFFD.
    await expect(p.acquireLease('x'.repeat(255) + '\uD800', 'o', LONG)).rejects.toMatchObject({ code: 'ERR_LEASE_INVALID_KEY' })
    await expect(p.acquireLease('x'.repeat(254) + '\uDC00', 'o', LONG)).rejects.toMatchObject({ code: 'ERR_LEASE_INVALID_KEY' })
  })

  it('two providers do not share state', async () => {
    const a = open()
    const b = open()
    const key = uniqueKey('isolated')
    expect(await a.acquireLease(key, 'A', LONG)).toStrictEqual({ acquired: true, owner: 'A' })
    expect(await b.getLeaseOwner(key)).toBeUndefined()
    expect(await b.acquireLease(key, 'B', LONG)).toStrictEqual({ acquired: true, owner: 'B' })
    expect(await a.getLeaseOwner(key)).toBe('A')
    await a.releaseLease(key, 'A')
    expect(await b.getLeaseOwner(key)).toBe('B')
    expect(a.size).toBe(0)
    expect(b.size).toBe(1)
  })

  it('size is a number property, not a method', () => {
    const p = open()
    expect(typeof p.size).toBe('number')
  })

  // Wall-clock jumps: lease-clock-jumps.spec.ts jumps a child's clock ±1 h under libfaketime.
})
