# The node's sandbox ("pause") image. hack/cluster builds it offline with
# hack/oci-archive, the tool that writes the operator's image, from the
# static hack/pause.c it compiles into the build context first.
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
