// The one tracing type the layers below telemetry carry: a request's W3C trace context as it
// travels (a bus envelope, `_meta`). Tracing itself lives in telemetry/tracing.ts.

/** W3C trace context of one request, as it travels (bus envelope, `_meta`). */
export interface TraceCarrier {
  traceparent: string
  tracestate?: string
}
