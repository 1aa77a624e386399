{
  description = "Test stand-in for huggingface/kernels' genKernelFlakeOutputs (offline mock evaluation only)";

  # Never fetched: the tests always override both with the stand-ins next to this flake.
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs";
    flake-utils.url = "github:numtide/flake-utils";
  };

  outputs =
    {
      self,
      nixpkgs,
      flake-utils,
    }:
    let
      systems = [
        "aarch64-darwin"
        "aarch64-linux"
        "x86_64-linux"
      ];

      genKernelFlakeOutputs =
        {
          path,
          self ? null,
          rev ? null,
          torchVersions ? null,
          doGetKernelCheck ? true,
          pythonCheckInputs ? (_: [ ]),
          pythonNativeCheckInputs ? (_: [ ]),
        }:
        assert rev == null || throw "`rev` argument of `genKernelFlakeOutputs` is deprecated, pass `self`";
        assert
          torchVersions == null
          || builtins.isFunction torchVersions
          || throw "`torchVersions` must be a function taking one argument (the default version set)";
        let
          # Upstream throws when `self` has no rev. The mock cannot: Nix marks
          # `self` dirty (no rev) whenever the lock in use differs from
          # flake.lock, which every --override-input does. Instead it checks
          # that `self` is a flake whose source tree contains `path`.
          kernelSelf =
            if self == null then
              throw "Flake's `self` must be passed to `genKernelFlakeOutputs`"
            else if !(self ? outPath && self ? lastModified) then
              throw "mock genKernelFlakeOutputs: `self` is not a flake"
            else if builtins.substring 0 (builtins.stringLength selfRoot) (toString path) != selfRoot then
              throw "mock genKernelFlakeOutputs: path ${toString path} is not inside self (${selfRoot})"
            else
              self;
          selfRoot = toString self.outPath + "/";
          shortRev = kernelSelf.shortRev or kernelSelf.dirtyShortRev or "norev";
          fullRev = kernelSelf.rev or kernelSelf.dirtyRev or null;

          toml = builtins.fromTOML (builtins.readFile (path + "/build.toml"));
          name = toml.general.name;
          pythonName = builtins.replaceStrings [ "-" ] [ "_" ] name;
          repoId = toml.general.hub.repo-id or null;
          components = builtins.attrValues (toml.kernel or { });
          hasComponent = backend: builtins.any (c: (c.backend or null) == backend) components;

          # A plausible subset of the real variant list (one Torch version).
          variantsFor =
            system:
            let
              isDarwin = system == "aarch64-darwin";
              cxx = if isDarwin then "" else "-cxx11";
              arch =
                backend:
                {
                  cpu = [ "torch213${cxx}-cpu-${system}" ];
                  cuda = if isDarwin then [ ] else [ "torch213-cxx11-cu130-${system}" ];
                  rocm = if system == "x86_64-linux" then [ "torch213-cxx11-rocm72-${system}" ] else [ ];
                  xpu = if system == "x86_64-linux" then [ "torch213-cxx11-xpu20260-${system}" ] else [ ];
                  metal = if isDarwin then [ "torch213-metal-${system}" ] else [ ];
                }
                .${backend} or [ ];
              forBackend =
                backend:
                if toml ? torch-noarch || !(hasComponent backend) then [ "torch-${backend}" ] else arch backend;
            in
            builtins.concatMap forBackend toml.general.backends;

          metadataFor =
            variant:
            builtins.toJSON {
              inherit name variant;
              id = "_${pythonName}_${builtins.replaceStrings [ "-" ] [ "_" ] shortRev}";
              repo-id = repoId;
              kernel-sha = fullRev;
              # `path` relative to the root of `self` (the kernel folder in the repo).
              kernel-dir = builtins.substring (builtins.stringLength selfRoot) (builtins.stringLength (toString path)) (toString path);
              mock = true;
            };

          perSystem =
            system:
            let
              pkgs = nixpkgs.legacyPackages.${system};
              variants = variantsFor system;

              mkVariants =
                drvName: vs:
                pkgs.runCommand drvName { } (
                  "set -e\nmkdir -p \"$out\"\n"
                  + builtins.concatStringsSep "" (
                    map (v: ''
                      mkdir -p "$out/${v}"
                      printf '%s\n' ${nixpkgs.lib.escapeShellArg (metadataFor v)} > "$out/${v}/metadata.json"
                      printf '# mock build of ${name} (${v})\n' > "$out/${v}/__init__.py"
                    '') vs
                  )
                );

              bundle = mkVariants "${name}-bundle" variants;
              firstOrEmpty = l: if l == [ ] then [ ] else [ (builtins.head l) ];
              # Like upstream: outputs that need a best variant throw on a
              # system where the kernel has none.
              needsVariant = value: if variants == [ ] then throw "No build variant is compatible with this system" else value;
              shell = kind: needsVariant (pkgs.runCommand "${name}-${kind}-shell" { } "mkdir -p $out");
            in
            {
              packages = {
                inherit bundle variants;
                default = bundle;
                archVariants = variants;
                ci = mkVariants "${name}-ci" (firstOrEmpty variants);
                redistributable = builtins.listToAttrs (
                  map (v: {
                    name = v;
                    value = mkVariants "${name}-${v}" [ v ];
                  }) variants
                );

                # Like upstream: copy every bundle entry into ./build of the
                # current directory, replacing only the entries it copies.
                build-and-copy = pkgs.writeShellScriptBin "build-and-copy" ''
                  set -eu
                  mkdir -p build
                  for variant_dir in ${bundle}/*; do
                    variant=$(basename "$variant_dir")
                    rm -rf "build/$variant"
                    cp -r "$variant_dir" build/
                  done
                  chmod -R u+w build
                '';

                build-and-upload =
                  if repoId == null then
                    throw "[general.hub] section in build.toml does not have a `repo-id` field."
                  else
                    pkgs.writeShellScriptBin "build-and-upload" ''
                      echo "mock: kernel-builder upload --repo-id ${repoId} ${bundle}"
                    '';

                ci-test = needsVariant (
                  pkgs.writeShellScriptBin "ci-test" ''
                    echo "mock: pytest ${name}/tests -m kernels_ci"
                  ''
                );
              };

              devShells = {
                default = shell "dev";
                test = shell "test";
              };
            };
        in
        flake-utils.lib.eachSystem systems perSystem;
    in
    {
      lib = {
        inherit genKernelFlakeOutputs;
        genFlakeOutputs = _: throw "genFlakeOutputs has been renamed to genKernelFlakeOutputs";
      };
    };
}
