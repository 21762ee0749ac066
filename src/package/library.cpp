// libfusebox.so is assembled from the layers' objects (CMakeLists.txt); a
// shared library target needs one source of its own, and this is it.
namespace fusebox::package {
// Lets `nm -D libfusebox.so | grep package_marker` tell an installed build.
extern const char kPackageMarker[] = "fusebox shared library";
}  // namespace fusebox::package
