package io.deltawheel.storage;

import java.util.Optional;

import software.amazon.awssdk.core.interceptor.Context;
import software.amazon.awssdk.core.interceptor.ExecutionAttributes;
import software.amazon.awssdk.core.interceptor.ExecutionInterceptor;
import software.amazon.awssdk.http.SdkHttpRequest;

/**
 * An S3A request interceptor ({@code fs.s3a.audit.execution.interceptors}) that drops
 * {@code Expect: 100-continue} from small uploads.
 *
 * <p>The AWS SDK puts the header on every PutObject and UploadPart with a body, and its HTTP client
 * then sends the headers, waits for the server's {@code 100 Continue}, and only then the body:
 * two round trips for each upload, whatever {@code fs.s3a.connection.expect.continue} says. The
 * header saves sending a large body to a server that would refuse it; for the small files of a
 * commit (Delta's {@code N.json} and checksum, a streaming query's offset and commit files) it only
 * costs a round trip. Uploads larger than {@link #MAX_BYTES} keep it. The interceptors set in S3A's
 * settings run after the SDK's own, so the header is gone before the request is sent.
 */
public class NoExpectContinue implements ExecutionInterceptor {

    /** The largest body sent without waiting for the server's go-ahead. */
    static final long MAX_BYTES = 1L << 20;

    @Override
    public SdkHttpRequest modifyHttpRequest(Context.ModifyHttpRequest context, ExecutionAttributes attributes) {
        SdkHttpRequest request = context.httpRequest();
        if (!request.firstMatchingHeader("Expect").isPresent()) {
            return request;
        }
        // an aws-chunked body (its checksum in a trailer) states its own length beside the encoded one
        Optional<String> length = request.firstMatchingHeader("x-amz-decoded-content-length");
        if (!length.isPresent()) {
            length = request.firstMatchingHeader("Content-Length");
        }
        long bytes;
        try {
            bytes = length.map(Long::parseLong).orElse(Long.MAX_VALUE);
        } catch (NumberFormatException e) {
            return request;
        }
        return bytes > MAX_BYTES ? request : request.toBuilder().removeHeader("Expect").build();
    }
}
