// A Kubernetes streaming client built on independent SPDY/3.1 and WebSocket
// implementations (npm's spdy-transport and ws), driven by the Rust
// integration tests: `node client.js '<json>'` prints one JSON result.
//
// Modes:
//   exec:        SPDY upgrade + remotecommand streams (error, stdin, stdout,
//                stderr, resize), as client-go's SPDY executor opens them.
//   portforward: SPDY upgrade (or the SPDY/3.1+portforward.k8s.io WebSocket
//                tunnel) + error/data stream pairs, as client-go does.
'use strict'

const net = require('net')
const crypto = require('crypto')
const transport = require('spdy-transport')

const opts = JSON.parse(process.argv[2])

function fail (msg) {
  process.stdout.write(JSON.stringify({ fatal: String(msg) }) + '\n')
  process.exit(1)
}

// HTTP/1.1 upgrade to SPDY/3.1 by hand: neither library does it.
function upgrade (url, protocols) {
  return new Promise((resolve, reject) => {
    const u = new URL(url)
    const sock = net.connect(Number(u.port), u.hostname)
    // Go's TCP connections (client-go) have Nagle off; so does this one.
    sock.setNoDelay(true)
    let buf = Buffer.alloc(0)
    sock.once('connect', () => {
      let req = `POST ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n`
      for (const p of protocols) req += `X-Stream-Protocol-Version: ${p}\r\n`
      req += 'Content-Length: 0\r\n\r\n'
      sock.write(req)
    })
    const onData = (d) => {
      buf = Buffer.concat([buf, d])
      const end = buf.indexOf('\r\n\r\n')
      if (end < 0) return
      sock.removeListener('data', onData)
      sock.pause()
      const head = buf.slice(0, end).toString()
      const rest = buf.slice(end + 4)
      const status = Number(head.split(' ')[1])
      const headers = {}
      for (const line of head.split('\r\n').slice(1)) {
        const i = line.indexOf(':')
        headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim()
      }
      if (status !== 101) {
        resolve({ status, headers, body: rest.toString() })
        sock.destroy()
        return
      }
      if (rest.length) sock.unshift(rest)
      resolve({ status, headers, sock })
    }
    sock.on('data', onData)
    sock.on('error', reject)
  })
}

// The WebSocket tunnel of client-go's port-forward. Its subprotocol,
// "SPDY/3.1+portforward.k8s.io", has a '/', which RFC 6455's token syntax
// (and so the ws client) refuses while gorilla/websocket sends it: the
// handshake is done by hand and ws takes over the upgraded socket.
function tunnel (url) {
  const WebSocket = require('ws')
  return new Promise((resolve, reject) => {
    const u = new URL(url)
    const key = crypto.randomBytes(16).toString('base64')
    const sock = net.connect(Number(u.port), u.hostname)
    let buf = Buffer.alloc(0)
    sock.once('connect', () => {
      sock.write(`GET ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
        `Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\n` +
        'Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io\r\n\r\n')
    })
    const onData = (d) => {
      buf = Buffer.concat([buf, d])
      const end = buf.indexOf('\r\n\r\n')
      if (end < 0) return
      sock.removeListener('data', onData)
      const head = buf.slice(0, end).toString()
      if (!head.startsWith('HTTP/1.1 101')) return reject(new Error(head.split('\r\n')[0]))
      const accept = crypto.createHash('sha1').update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64')
      if (!head.toLowerCase().includes('sec-websocket-accept: ' + accept.toLowerCase())) return reject(new Error('bad accept'))
      if (!head.toLowerCase().includes('sec-websocket-protocol: spdy/3.1+portforward.k8s.io')) return reject(new Error('no tunnel protocol'))
      const ws = new WebSocket(null, undefined, {})
      ws._isServer = false // a client: mask what it sends
      ws.setSocket(sock, buf.slice(end + 4), { maxPayload: 64 * 1024 * 1024 })
      resolve(WebSocket.createWebSocketStream(ws))
    }
    sock.on('data', onData)
    sock.on('error', reject)
  })
}

function client (sock) {
  const conn = transport.connection.create(sock, { protocol: 'spdy', isServer: false })
  conn.start(3.1)
  conn.on('error', (e) => { process.stderr.write('connection error: ' + e + '\n') })
  return conn
}

// Opens a stream and waits for its SYN_REPLY, as client-go does.
function open (conn, headers) {
  return new Promise((resolve, reject) => {
    const s = conn.request({ method: 'POST', path: '/', host: 'localhost', headers }, (err) => {
      if (err) reject(err)
    })
    s.on('error', (e) => reject(e))
    s.once('response', () => resolve(s))
  })
}

function collect (s) {
  return new Promise((resolve) => {
    const parts = []
    s.on('data', (d) => parts.push(d))
    s.on('end', () => resolve(Buffer.concat(parts)))
    s.on('error', () => resolve(Buffer.concat(parts)))
    s.on('close', () => resolve(Buffer.concat(parts)))
  })
}

async function exec () {
  const up = await upgrade(opts.url, opts.protocols || ['v4.channel.k8s.io', 'v3.channel.k8s.io', 'v2.channel.k8s.io', 'channel.k8s.io'])
  if (up.status !== 101) return { status: up.status, body: up.body }
  const conn = client(up.sock)
  const error = await open(conn, { streamtype: 'error' })
  error.end()
  const stdin = opts.stdin ? await open(conn, { streamtype: 'stdin' }) : null
  const stdout = opts.stdout ? await open(conn, { streamtype: 'stdout' }) : null
  const stderr = opts.stderr ? await open(conn, { streamtype: 'stderr' }) : null
  const resize = opts.tty ? await open(conn, { streamtype: 'resize' }) : null
  const outP = stdout ? collect(stdout) : Promise.resolve(Buffer.alloc(0))
  const errP = stderr ? collect(stderr) : Promise.resolve(Buffer.alloc(0))
  const statusP = collect(error)
  if (resize) {
    for (const [w, h] of (opts.resize || [])) resize.write(JSON.stringify({ Width: w, Height: h }) + '\n')
  }
  if (stdin) {
    if (opts.input) stdin.write(opts.input)
    if (opts.closeStdin !== false) stdin.end()
  }
  if (opts.vanishAfterMs !== undefined) {
    await new Promise((resolve) => setTimeout(resolve, opts.vanishAfterMs))
    up.sock.destroy()
    return { protocol: up.headers['x-stream-protocol-version'], vanished: true }
  }
  const [out, err, status] = await Promise.all([outP, errP, statusP])
  return {
    protocol: up.headers['x-stream-protocol-version'],
    stdout: out.toString(),
    stderr: err.toString(),
    status: status.toString()
  }
}

// Deterministic bytes: xorshift32 seeded per request.
function * chunks (seed, total) {
  let x = (seed * 2654435761 + 1) >>> 0 || 1
  let left = total
  while (left > 0) {
    const n = Math.min(left, 64 * 1024)
    const b = Buffer.allocUnsafe(n)
    for (let i = 0; i + 4 <= n; i += 4) {
      x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0
      b.writeUInt32LE(x, i)
    }
    for (let i = n - (n % 4); i < n; i++) b[i] = i & 0xff
    left -= n
    yield b
  }
}

async function forwardOne (conn, port, id, bytes) {
  const headers = { streamtype: 'error', port: String(port), requestid: String(id) }
  const error = await open(conn, headers)
  error.end()
  const errorP = collect(error)
  const data = await open(conn, Object.assign({}, headers, { streamtype: 'data' }))
  const sent = crypto.createHash('sha256')
  const recv = crypto.createHash('sha256')
  let received = 0
  const recvP = new Promise((resolve) => {
    data.on('data', (d) => { recv.update(d); received += d.length })
    data.on('end', resolve)
    data.on('close', resolve)
    data.on('error', resolve)
  })
  for (const c of chunks(id + 1, bytes)) {
    sent.update(c)
    if (!data.write(c)) await new Promise((resolve) => data.once('drain', resolve))
  }
  data.end()
  await recvP
  const err = (await errorP).toString()
  return { sent: sent.digest('hex'), received: recv.digest('hex'), bytes: received, error: err }
}

async function portforward () {
  let sock
  if (opts.tunnel) {
    sock = await tunnel(opts.url)
  } else {
    const up = await upgrade(opts.url, ['portforward.k8s.io'])
    if (up.status !== 101) return { status: up.status, body: up.body }
    sock = up.sock
  }
  const conn = client(sock)
  const started = Date.now()
  const jobs = []
  for (let i = 0; i < (opts.pairs || 1); i++) jobs.push(forwardOne(conn, opts.port, i, opts.bytes || 0))
  const results = await Promise.all(jobs)
  const ms = Date.now() - started
  return { results, ms }
}

const modes = { exec, portforward }
if (!modes[opts.mode]) fail('unknown mode ' + opts.mode)
const watchdog = setTimeout(() => fail('client timed out'), opts.timeoutMs || 120000)
modes[opts.mode]().then((r) => {
  clearTimeout(watchdog)
  process.stdout.write(JSON.stringify(r) + '\n')
  process.exit(0)
}, fail)
