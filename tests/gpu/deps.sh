# deps.sh — sourced by the GPU-machine scripts: unpack the carried Debian packages (.debs, made here by
# ../shared/tools/offline-debs.sh) into /opt/deps and point pkg-config, the loader and PATH at them.
# That machine has no package access of its own; this is the recipe from offline-debs.sh's header.
if [ -d .debs ] && ls .debs/*.deb >/dev/null 2>&1; then
  if [ ! -d /opt/deps/usr ]; then
    for f in .debs/*.deb; do dpkg -x "$f" /opt/deps; done
    sed -i '/^Requires.private/d' /opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  fi
  export PKG_CONFIG_SYSROOT_DIR=/opt/deps
  export PKG_CONFIG_PATH=/opt/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/opt/deps/usr/share/pkgconfig
  export LD_LIBRARY_PATH=/opt/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$PATH:/opt/deps/usr/bin:/usr/local/cuda/bin
fi
