import { fork } from 'node:child_process'
import { spawn } from 'node:child_process'
const mode = process.argv[2]
const port = 6390 + Math.floor(Math.random()*100)
const redis = spawn('redis-server', ['--port', String(port), '--save', '', '--appendonly', 'no'], { stdio: 'ignore' })
await new Promise(r => setTimeout(r, 300))
const sock = `/tmp/proto-${process.pid}.sock`
const kids = [0,1,2].map(i => fork('./child.mjs', [sock, `redis://127.0.0.1:${port}`, mode, String(i)], { execPath: process.execPath }))
const msgs = []
const wait = (pred) => new Promise(res => { const check = () => { if (pred()) res(); else setTimeout(check, 20) }; check() })
for (const k of kids) k.on('message', m => { msgs.push(m); console.log(Date.now() % 100000, JSON.stringify(m)) })
await wait(() => msgs.filter(m => m.type === 'ready').length === 3)
for (const k of kids) k.send({ type: 'fire' })
await wait(() => msgs.filter(m => m.type === 'accepted').length === 3)
await new Promise(r => setTimeout(r, 4000))
for (const k of kids) k.send({ type: 'report' })
await wait(() => msgs.filter(m => m.type === 'report').length === 3)
for (const k of kids) k.kill()
redis.kill()
